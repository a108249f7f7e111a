"""After the fuzzing: a well-behaved client of the cluster still appends and reads back."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

from waltz_client.runtime.tasks import wait_for
from waltz_client.runtime.tls import TlsFiles
from waltz_client.wire.errors import describe


@dataclass(frozen=True, slots=True)
class ClientCheck:
    ok: bool
    committed: int
    read_back: int
    detail: str


async def check_client(
    zookeeper: str,
    zk_root: str,
    transactions: int = 8,
    timeout: float = 60.0,
    *,
    tls: TlsFiles | None = None,
    zk_tls: TlsFiles | None = None,
) -> ClientCheck:
    """Append ``transactions`` transactions through the client library, spread over the
    partitions, and read each back (its data, and a range read). A healthy cluster
    takes well under a second; ``timeout`` only bounds a cluster that does not serve."""
    from waltz_client.client import WaltzClient
    from waltz_client.config import WaltzClientConfig
    from waltz_client.transaction import TransactionBuilder, TransactionContext

    class Put(TransactionContext):
        def __init__(self, partition: int, data: bytes) -> None:
            self.partition, self.data = partition, data

        def partition_id(self, num_partitions: int) -> int:
            return self.partition

        def execute(self, builder: TransactionBuilder) -> bool:
            builder.set_header(len(self.data))
            builder.set_data(self.data)
            return True

    config = WaltzClientConfig(
        zookeeper, zk_root=zk_root, feed=False, max_retries=200, tls=tls, zk_tls=zk_tls
    )
    nonce = uuid.uuid4().hex

    async def run() -> ClientCheck:
        async with WaltzClient(config) as client:
            n = client.num_partitions
            puts = [Put(i % n, f"fuzz check {nonce} {i}".encode()) for i in range(transactions)]
            tasks = [asyncio.ensure_future(client.submit(p)) for p in puts]
            _, pending = await asyncio.wait(tasks, timeout=timeout)
            for task in pending:
                task.cancel()
            # Which partitions did not serve says more than a timeout.
            stuck = sorted(
                {put.partition for put, t in zip(puts, tasks, strict=True) if t in pending}
            )
            if stuck:
                return ClientCheck(
                    False,
                    len(tasks) - len(pending),
                    0,
                    f"partitions {stuck}: not committed within {timeout:g} s",
                )
            results = [t.result() for t in tasks]
            failed = [r.reason for r in results if not r.committed]
            if failed:
                return ClientCheck(False, transactions - len(failed), 0, f"not committed: {failed}")
            read = 0
            for put, result in zip(puts, results, strict=True):
                txid = result.transaction_id
                data = await client.transaction_data(put.partition, txid)
                ranged = [r.data async for r in client.read(put.partition, txid, txid)]
                if data != put.data or ranged != [put.data]:
                    return ClientCheck(
                        False,
                        transactions,
                        read,
                        f"partition {put.partition} transaction {txid}: read back "
                        f"{data!r} / {ranged!r}, appended {put.data!r}",
                    )
                read += 1
            return ClientCheck(True, transactions, read, f"on {n} partitions")

    try:
        return await wait_for(run(), 2 * timeout)  # reads have their own timeouts
    except Exception as e:  # the check's verdict, whatever broke
        return ClientCheck(False, 0, 0, f"{type(e).__name__}: {describe(e)}")
