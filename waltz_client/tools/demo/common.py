"""What the demo, the smoke test and the benchmark share: argument checks and a fresh
local cluster."""

from __future__ import annotations

import argparse
import asyncio
import shutil
import time
from collections.abc import Awaitable, Callable

from waltz_client.tools.local.cluster import LocalCluster
from waltz_client.transaction import Lock, TransactionBuilder, TransactionContext

# A dead server's partitions move once its ZooKeeper session expires: keep that short.
FAST_FAILOVER = ["--zk-session-timeout", "4"]


class Put(TransactionContext):
    """One transaction of given bytes on a given partition, with an optional header and write
    lock: the load of ``waltz bench``, its ``--compare`` sweep, ``waltz soak`` and the Spark
    demo job."""

    __slots__ = ("data", "header", "lock", "partition")

    def __init__(
        self, partition: int, data: bytes, lock: Lock | None = None, header: int | None = None
    ) -> None:
        self.partition = partition
        self.data = data
        self.lock = lock
        self.header = header

    def partition_id(self, num_partitions: int) -> int:
        return self.partition

    def execute(self, builder: TransactionBuilder) -> bool:
        if self.header is not None:
            builder.set_header(self.header)
        builder.set_data(self.data)
        if self.lock is not None:
            builder.set_write_locks(self.lock)
        return True


class WritesMeasured:
    """For a dataclass with ``writes`` done in ``seconds`` and their ``latencies_ms``
    sorted: the rate and the percentiles."""

    writes: int
    seconds: float
    latencies_ms: list[float]

    @property
    def rate(self) -> float:
        return self.writes / self.seconds

    def percentile(self, q: float) -> float:
        lat = self.latencies_ms
        return lat[min(len(lat) - 1, int(q * len(lat)))] if lat else float("nan")


def check_at_least_one(prog: str, args: argparse.Namespace, *names: str) -> bool:
    """Print a one-line error (and return False) for the first of ``names`` below 1."""
    for name in names:
        if getattr(args, name) < 1:
            print(f"{prog}: error: --{name.replace('_', '-')} must be at least 1")
            return False
    return True


def fresh_cluster(
    data_dir: str, partitions: int, servers: int, server_args: list[str], tls: bool = False
) -> LocalCluster:
    """A local cluster (3 storage nodes, 3 replicas) in ``data_dir``, wiped first; with
    ``tls``, every link on mutual TLS (a throw-away CA)."""
    shutil.rmtree(data_dir, ignore_errors=True)
    return LocalCluster(
        data_dir,
        storages=3,
        partitions=partitions,
        replicas=3,
        servers=servers,
        server_args=server_args,
        tls=tls,
    )


async def open_loop(rate: float, total: int, one: Callable[[int], Awaitable[None]]) -> None:
    """Start ``one(0) .. one(total - 1)`` on schedule, ``rate`` per second, whatever the
    earlier ones are doing; return once all have finished. Every millisecond or so it
    starts what the schedule says is due by now. Only unfinished tasks are kept: tens of
    thousands of finished ones would make the garbage collector's pauses part of the
    measured latency."""
    running: set[asyncio.Task] = set()
    started = time.perf_counter()
    i = 0
    while i < total:
        due = min(total, int((time.perf_counter() - started) * rate) + 1)
        while i < due:
            task = asyncio.ensure_future(one(i))
            running.add(task)
            task.add_done_callback(running.discard)
            i += 1
        await asyncio.sleep(0.001)
    await asyncio.gather(*running)
