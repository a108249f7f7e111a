"""A storage process killed with SIGKILL in the middle of a stream of appends.

Two partitions are fed pipelined Appends of random 1 KiB records (several
in flight each) until a timer in another thread SIGKILLs the process. After
a restart on the same directory every acknowledged record is there byte for
byte, anything past the last acknowledgement is exactly what was sent, the
log continues from its max transaction ID, and ``waltz storage verify``
finds the files sound.
"""

from __future__ import annotations

import asyncio
import collections
import os
import random
import signal
import threading
import time
from collections.abc import Awaitable
from typing import TypeVar

import pytest

from waltz_client.wire.records import Record, ReqId
from waltz_client.wire.storage_client import StorageClient, StorageConnectionClosed
from waltz_client.wire.storage_messages import SuccessResponse

T = TypeVar("T")
SESSION = 3
PARTITIONS = (0, 1)
IN_FLIGHT = 6
RECORD_BYTES = 1024


def run(coro: Awaitable[T], timeout: float = 60.0) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


async def read_all(client: StorageClient, session: int, partition: int, first: int, last: int):
    out: list[Record] = []
    txid = first
    while txid <= last:
        batch = await client.records(session, partition, txid, last - txid + 1)
        assert len(batch) > 0, f"no records returned from transaction {txid}"
        out += batch.records()
        txid = out[-1].transaction_id + 1
    return out


class Stream:
    """Pipelined appends to one partition; remembers what was sent and what was acknowledged."""

    def __init__(self, client: StorageClient, partition: int, rng: random.Random) -> None:
        self.client = client
        self.partition = partition
        self.rng = rng
        self.sent: dict[int, Record] = {}
        self.acked: list[Record] = []
        self.ended_by: BaseException | None = None

    def _batch(self, first: int) -> list[Record]:
        n = self.rng.randint(1, 16)
        return [
            Record(
                txid,
                ReqId(self.partition, 1, self.partition, txid),
                self.rng.randrange(2**31),
                self.rng.randbytes(RECORD_BYTES),
            )
            for txid in range(first, first + n)
        ]

    async def run(self) -> None:
        window: collections.deque = collections.deque()
        nxt = 0
        try:
            while True:
                while len(window) < IN_FLIGHT:
                    batch = self._batch(nxt)
                    request = self.client.append_request(SESSION, self.partition, batch)
                    window.append((batch, self.client.submit(request)))
                    for rec in batch:
                        self.sent[rec.transaction_id] = rec
                    nxt += len(batch)
                batch, future = window.popleft()
                response = await future
                assert isinstance(response, SuccessResponse), response
                self.acked += batch  # responses arrive in order: acked stays a prefix
        except (StorageConnectionClosed, ConnectionError) as e:
            self.ended_by = e


@pytest.mark.parametrize("kill_after", [0.4, 0.7, 1.0])
def test_acknowledged_appends_survive_sigkill(storage_factory, waltz, kill_after):
    node = storage_factory(extra=["--segment-bytes", "1MiB", "--log-level", "INFO"])
    rng = random.Random(int(kill_after * 1000))
    killed_at: list[float] = []

    def kill() -> None:
        killed_at.append(time.monotonic())
        os.kill(node.pid, signal.SIGKILL)

    async def stream() -> list[Stream]:
        client = await node.client()
        streams = [Stream(client, p, rng) for p in PARTITIONS]
        timer = threading.Timer(kill_after, kill)
        timer.start()
        try:
            await asyncio.gather(*(s.run() for s in streams))
        finally:
            timer.join()
            await client.close()
        return streams

    started = time.monotonic()
    streams = run(stream())
    assert killed_at, "the kill timer never fired"
    assert killed_at[0] - started >= kill_after * 0.9
    for s in streams:
        # The stream was cut by the kill, with acknowledged and unacknowledged appends.
        assert s.ended_by is not None
        assert len(s.acked) > 0, "nothing was acknowledged before the kill"
        assert len(s.sent) > len(s.acked), "no append was in flight at the kill"

    node.restart(signal.SIGKILL)  # the process is dead already: this waits and starts anew

    async def check() -> dict[int, int]:
        async with await node.client() as c:
            maxes = {}
            for s in streams:
                p = s.partition
                last_acked = s.acked[-1].transaction_id
                max_txid = await c.max_transaction_id(SESSION, p)
                assert max_txid >= last_acked, (
                    f"partition {p}: max transaction {max_txid} < last acknowledged {last_acked}"
                )
                assert max_txid in s.sent, f"partition {p}: max {max_txid} was never sent"
                stored = await read_all(c, SESSION, p, 0, max_txid)
                assert [r.transaction_id for r in stored] == list(range(max_txid + 1))
                # Every acknowledged record byte for byte...
                for rec in s.acked:
                    got = stored[rec.transaction_id]
                    assert got == rec, f"partition {p}: transaction {rec.transaction_id} differs"
                # ...and anything kept past it is exactly what was sent.
                for got in stored[len(s.acked) :]:
                    assert got == s.sent[got.transaction_id]
                # Appending continues from max + 1 (and only from there).
                nxt = Record(max_txid + 1, ReqId(7, 7, p, 0), 1, rng.randbytes(RECORD_BYTES))
                await c.append(SESSION, p, [nxt])
                assert await c.record(SESSION, p, max_txid + 1) == nxt
                maxes[p] = max_txid + 1
            return maxes

    maxes = run(check())
    assert node.stop() == 0, node.log()

    result = waltz("storage", "verify", str(node.directory))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "CORRUPT" not in result.stdout
    # verify saw every record: the per-segment counts add up to max + 1 per partition.
    for p, max_txid in maxes.items():
        lines = [ln for ln in result.stdout.splitlines() if f"/data/{p}/" in ln]
        assert lines and all(ln.startswith("OK") for ln in lines), result.stdout
        counted = sum(int(ln.split("(")[1].split(" records")[0]) for ln in lines)
        assert counted == max_txid + 1, result.stdout
