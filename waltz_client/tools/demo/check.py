"""``waltz check``: prove a running cluster works end to end, from a client's seat.

Appends transactions with write locks on a few shared keys (so that lock conflicts and
retries happen), while a second client follows the committed feed; then checks that
every acknowledged transaction reached the feed exactly once, in gap-free order per
partition, with a commit time that never goes back (where the servers stamp them), and
reads back with its data and the same time through a range read. Exit 0 when all holds.
The Helm chart's ``helm test`` runs it; so can anyone with the cluster's address.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid

from waltz_client.callbacks import WaltzClientCallbacks
from waltz_client.client import SubmitStatus, WaltzClient
from waltz_client.cluster.errors import ClusterError
from waltz_client.config import WaltzClientConfig, WaltzConfigError
from waltz_client.runtime import event_loop
from waltz_client.runtime.tasks import wait_for
from waltz_client.runtime.tls import TlsFiles
from waltz_client.transaction import Lock, Transaction, TransactionBuilder, TransactionContext

LOCK_KEYS = 8  # shared keys: appends conflict and retry
IN_FLIGHT = 16  # submissions at once: about two per key, so retries end


def register(groups: argparse._SubParsersAction) -> None:
    p = groups.add_parser("check", help="append with locks and read back on a running cluster")
    p.add_argument(
        "--zookeeper", "-z", default=os.environ.get("WALTZ_ZOOKEEPER"), help="env WALTZ_ZOOKEEPER"
    )
    p.add_argument("--root", default=os.environ.get("WALTZ_ROOT", "/waltz"), help="env WALTZ_ROOT")
    p.add_argument("--transactions", type=int, default=200, help="to append (default 200)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds for it all")
    for prefix, what in (("tls", "servers"), ("zk-tls", "ZooKeeper")):
        for part in ("cert", "key", "ca"):
            env = f"WALTZ_{prefix.upper().replace('-', '_')}_{part.upper()}"
            p.add_argument(
                f"--{prefix}-{part}",
                default=os.environ.get(env, ""),
                help=f"PEM {part} to reach {what} over TLS (env {env})",
            )
    p.set_defaults(func=cmd_check)


class _Put(TransactionContext):
    def __init__(self, index: int, payload: bytes) -> None:
        self.index = index
        self.payload = payload

    def partition_id(self, num_partitions: int) -> int:
        return self.index % num_partitions

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_header(self.index)
        builder.set_data(self.payload)
        builder.set_write_locks(Lock("waltz-check", self.index % LOCK_KEYS))
        return True


class _Follower(WaltzClientCallbacks):
    """Applies the feed from where each partition was when the check began."""

    def __init__(self, start: dict[int, int]) -> None:
        self.applied = dict(start)
        self.seen: dict[bytes, list[tuple[int, int]]] = {}  # payload -> (partition, id)
        self.gaps: list[str] = []
        self.times: dict[tuple[int, int], int | None] = {}  # (partition, id) -> commit time
        self.last_time: dict[int, int] = {}  # partition -> the latest commit time seen
        self.backwards: list[str] = []

    async def client_high_water_mark(self, partition_id: int) -> int:
        return self.applied[partition_id]

    async def apply_transaction(self, transaction: Transaction) -> None:
        p, txid = transaction.partition_id, transaction.transaction_id
        # The data first: if fetching it fails (a server busy or moving), nothing is
        # applied, and the client delivers the transaction again from applied[p].
        data = await transaction.data()
        if txid != self.applied[p] + 1:
            self.gaps.append(f"partition {p}: {txid} after {self.applied[p]}")
        self.applied[p] = txid
        self.seen.setdefault(data, []).append((p, txid))
        stamp = transaction.timestamp
        self.times[p, txid] = stamp
        if stamp is not None:
            if stamp < self.last_time.get(p, stamp):
                self.backwards.append(
                    f"partition {p}: transaction {txid} committed at {stamp}, after one at "
                    f"{self.last_time[p]}"
                )
            self.last_time[p] = max(stamp, self.last_time.get(p, stamp))


def _files(args: argparse.Namespace, prefix: str) -> TlsFiles | None:
    parts = [getattr(args, f"{prefix}_{part}") or None for part in ("cert", "key", "ca")]
    return TlsFiles(*parts) if any(parts) else None


async def _check(args: argparse.Namespace) -> list[str]:
    tls, zk_tls = _files(args, "tls"), _files(args, "zk_tls")
    base = WaltzClientConfig(args.zookeeper, zk_root=args.root, feed=False, tls=tls, zk_tls=zk_tls)
    problems: list[str] = []
    run = uuid.uuid4().hex[:12]
    async with WaltzClient(base) as writer:
        partitions = range(writer.num_partitions)
        start = {p: await writer.high_water_mark(p) for p in partitions}
        follower = _Follower(start)
        following = WaltzClientConfig(
            args.zookeeper, zk_root=args.root, feed=True, tls=tls, zk_tls=zk_tls
        )
        async with WaltzClient(following, follower):
            began = time.monotonic()
            contexts = [_Put(i, f"check {run} {i}".encode()) for i in range(args.transactions)]
            window = asyncio.Semaphore(IN_FLIGHT)

            async def submit(context: _Put):
                async with window:
                    return await writer.submit(context)

            results = await asyncio.gather(*(submit(c) for c in contexts))
            elapsed = time.monotonic() - began
            committed = {
                c.payload: r.transaction_id
                for c, r in zip(contexts, results, strict=True)
                if r.status == SubmitStatus.COMMITTED
            }
            failed = [r for r in results if r.status != SubmitStatus.COMMITTED]
            for r in failed[:5]:
                problems.append(f"a submission {r.status.name}: {r.reason}")
            retries = sum(r.attempts - 1 for r in results)
            print(
                f"appended {len(committed)} of {len(contexts)} in {elapsed:.1f} s "
                f"({len(committed) / max(elapsed, 1e-9):.0f} tx/s, {retries} lock retries)"
            )
            ends = {p: await writer.high_water_mark(p) for p in partitions}
            while any(follower.applied[p] < ends[p] for p in partitions):
                await asyncio.sleep(0.1)
        for payload, txid in committed.items():
            seen = follower.seen.get(payload, [])
            if len(seen) != 1 or seen[0][1] != txid:
                problems.append(f"{payload.decode()}: committed as {txid}, in the feed {seen}")
        problems += [f"feed gap: {g}" for g in follower.gaps]
        problems += [f"commit time went back: {b}" for b in follower.backwards]
        read_back = 0
        for p in (p for p in partitions if ends[p] > start[p]):
            async for record in writer.read(p, start[p] + 1, ends[p]):
                if record.data in committed:
                    read_back += 1
                    if committed[record.data] != record.transaction_id:
                        problems.append(f"range read: {record.data.decode()} at the wrong ID")
                    fed = follower.times.get((p, record.transaction_id))
                    read_time = None if record.timestamp < 0 else record.timestamp
                    if fed != read_time:
                        problems.append(
                            f"range read: {record.data.decode()} committed at {read_time}, "
                            f"the feed said {fed}"
                        )
        if read_back != len(committed):
            problems.append(f"range reads found {read_back} of {len(committed)} transactions")
    print(
        f"feed: {sum(len(v) for v in follower.seen.values())} transactions applied, "
        f"{len(follower.gaps)} gaps; range reads: {read_back} found"
    )
    return problems


def cmd_check(args: argparse.Namespace) -> int:
    if not args.zookeeper:
        print("waltz check: error: pass --zookeeper or set WALTZ_ZOOKEEPER", file=sys.stderr)
        return 2
    if args.transactions < 1:
        print("waltz check: error: --transactions must be at least 1", file=sys.stderr)
        return 2
    try:
        problems = event_loop.run(wait_for(_check(args), args.timeout))
    except (WaltzConfigError, ValueError, ClusterError) as e:
        print(f"waltz check: error: {e}", file=sys.stderr)
        return 2
    except TimeoutError:
        print(f"waltz check: FAIL: not done within {args.timeout:g} s", file=sys.stderr)
        return 1
    for problem in problems:
        print(f"FAIL  {problem}")
    print("PASS" if not problems else "FAIL")
    return 0 if not problems else 1
