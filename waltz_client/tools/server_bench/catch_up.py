"""``waltz server bench-catch-up``: add a replica to a full partition under load.

Starts a throw-away local cluster (embedded ZooKeeper, four storage nodes, one server,
one partition on three of them), fills the partition with ``--transactions``
transactions as fast as it commits them (the saturated rate), then runs a producer at
``--load`` of that rate (open loop: a transaction is due every 1/rate s, whatever the
commits do) and assigns the partition to the fourth storage node. The new replica is
copied in the background and joins at a planned session boundary; the benchmark
reports the copy rate and what the producer saw meanwhile: the longest gap between two
commits, and commit latencies.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import platform
import re
import tempfile
import time

from waltz_client.cluster.admin import assign_partitions, read_assignment
from waltz_client.cluster.zk import close, connect
from waltz_client.runtime import event_loop
from waltz_client.runtime.tasks import wait_for
from waltz_client.tools.local.cluster import LocalCluster
from waltz_client.wire.client_messages import (
    AppendRequest,
    ClientMessage,
    FeedData,
    MountRequest,
    MountResponse,
    MountStatus,
)
from waltz_client.wire.records import ReqId
from waltz_client.wire.server_connection import ServerConnection

from .commit_rate import percentile

CAUGHT_UP = re.compile(r"caught up to (\d+): (\d+) transactions in ([\d.]+) s")


def register(cmds: argparse._SubParsersAction) -> None:
    p = cmds.add_parser(
        "bench-catch-up",
        help="add a replica to a full partition under load: copy rate and commit gaps",
    )
    p.add_argument(
        "--transactions", type=int, default=1_000_000, help="to fill with (default 1000000)"
    )
    p.add_argument("--size", type=int, default=1024, help="bytes of data each (default 1024)")
    p.add_argument(
        "--load",
        type=float,
        default=0.5,
        help="producer rate during the copy, as a fraction of the saturated rate; 0 copies "
        "with no producer (default 0.5)",
    )
    p.add_argument("--data-dir", help="cluster directory (default: a temporary one)")
    p.set_defaults(func=cmd_bench_catch_up)


class _Producer:
    """One mounted connection; appends and the times their commits arrive on the feed."""

    def __init__(self, client_id: int, generation: int) -> None:
        self.client_id = client_id
        self.generation = generation
        self.sent_at: dict[int, float] = {}
        self.latencies: list[float] = []
        self.commit_times: list[float] = []
        self.room = asyncio.Event()
        self.conn: ServerConnection | None = None
        self.seq = 0
        self.mounted: asyncio.Future[MountResponse] = asyncio.get_running_loop().create_future()

    def on_message(self, m: ClientMessage) -> None:
        if isinstance(m, FeedData):
            now = time.perf_counter()
            mine = 0
            for h in m.headers:
                if h.req_id.client_id == self.client_id:
                    started = self.sent_at.pop(h.req_id.seq, None)
                    if started is not None:
                        self.latencies.append(now - started)
                        mine += 1
            if mine:
                self.commit_times.append(now)
            self.room.set()
        elif isinstance(m, MountResponse) and not self.mounted.done():
            self.mounted.set_result(m)

    async def mount(self, port: int) -> None:
        self.conn = await ServerConnection.connect("127.0.0.1", port, on_message=self.on_message)
        self.conn.send(MountRequest(ReqId(self.client_id, self.generation, 0, 0), -1, 1))
        if (await wait_for(self.mounted, 60)).status != MountStatus.READY:
            raise RuntimeError("partition 0 did not mount")

    def send(self, payload: bytes) -> None:
        assert self.conn is not None
        self.seq += 1
        self.sent_at[self.seq] = time.perf_counter()
        q = ReqId(self.client_id, self.generation, 0, self.seq)
        self.conn.send(AppendRequest(q, -1, (), (), (), 0, payload))

    async def fill(self, count: int, payload: bytes, window: int = 2000) -> float:
        """Closed loop, ``window`` outstanding; the commit rate."""
        started = time.perf_counter()
        for _ in range(count):
            while len(self.sent_at) >= window:
                self.room.clear()
                await self.room.wait()
            self.send(payload)
            if self.seq % 64 == 0:
                assert self.conn is not None
                await self.conn.drain()
        await self.settle()
        return count / (time.perf_counter() - started)

    async def settle(self) -> None:
        while self.sent_at:
            self.room.clear()
            await wait_for(self.room.wait(), 120)

    async def open_loop(self, rate: float, payload: bytes, until: asyncio.Event) -> None:
        """A transaction due every 1/rate s, until ``until`` is set."""
        started = time.perf_counter()
        sent = 0
        while not until.is_set():
            due = int((time.perf_counter() - started) * rate)
            while sent < due:
                self.send(payload)
                sent += 1
            await asyncio.sleep(0.001)
        await self.settle()


def _server_log(cluster: LocalCluster) -> str:
    with open(cluster.servers[0].log_path) as f:
        return f.read()


async def _drive(cluster: LocalCluster, args: argparse.Namespace) -> dict:
    zk = connect(cluster.zookeeper_connect)
    try:
        assignment, _ = read_assignment(zk, cluster.layout.root)
        holders = assignment.replicas_of(0)
        (new,) = [a for a in cluster.layout.storage_addresses if a not in holders]
        generation = cluster.owner_index(0)[1]
        port = cluster.servers[0].ready["port"]
        payload = os.urandom(args.size)
        producer = _Producer(1, generation)
        await producer.mount(port)
        print(f"filling partition 0 with {args.transactions:,} transactions of {args.size} B")
        saturated = await producer.fill(args.transactions, payload)
        print(f"saturated commit rate: {saturated:,.0f} tx/s")
        producer.latencies.clear()
        producer.commit_times.clear()

        rate = saturated * args.load
        done = asyncio.Event()
        load = asyncio.get_running_loop().create_task(producer.open_loop(rate, payload, done))
        await asyncio.sleep(2.0)  # the producer's steady state before the change
        added = time.perf_counter()
        await asyncio.to_thread(assign_partitions, zk, cluster.layout.root, new, {0})
        print(f"added replica {new} under a producer at {rate:,.0f} tx/s")
        while not CAUGHT_UP.search(_server_log(cluster)):
            if time.perf_counter() - added > 1800:
                raise RuntimeError("the new replica did not catch up within 30 minutes")
            await asyncio.sleep(0.5)
        joined = time.perf_counter()
        await asyncio.sleep(2.0)  # past the join boundary
        done.set()
        await load
    finally:
        close(zk)
    match = CAUGHT_UP.search(_server_log(cluster))
    assert match is not None
    copied, seconds = int(match.group(2)), float(match.group(3))
    times = producer.commit_times
    gaps = sorted(b - a for a, b in itertools.pairwise(times))
    latencies = sorted(producer.latencies)
    return {
        "saturated": saturated,
        "rate": rate,
        "copied": copied,
        "copy_seconds": seconds,
        "copy_rate": copied / seconds if seconds else float("inf"),
        "until_joined": joined - added,
        "max_gap_ms": (gaps[-1] if gaps else 0.0) * 1000,
        "p50_ms": percentile(latencies, 0.50) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "max_ms": (latencies[-1] if latencies else 0.0) * 1000,
        "committed": len(latencies),
    }


def cmd_bench_catch_up(args: argparse.Namespace) -> int:
    problems = [
        (args.transactions < 1, f"--transactions must be at least 1, got {args.transactions}"),
        (args.size < 0, f"--size must be at least 0, got {args.size}"),
        (not 0 <= args.load <= 1, f"--load must be in [0, 1], got {args.load}"),
    ]
    for bad, message in problems:
        if bad:
            print(f"waltz server bench-catch-up: error: {message}")
            return 2
    with tempfile.TemporaryDirectory(prefix="waltz-bench-") as tmp:
        cluster = LocalCluster(
            args.data_dir or os.path.join(tmp, "cluster"),
            storages=4,
            partitions=1,
            replicas=3,
            servers=1,
        )
        print("starting a local cluster: 4 storage nodes, 1 server, partition 0 on 3 of them")
        cluster.start()
        try:
            result = event_loop.run(_drive(cluster, args))
        finally:
            cluster.stop()
    print(f"on {os.cpu_count()} CPUs ({platform.machine()})")
    print(
        f"copied {result['copied']:,} transactions in {result['copy_seconds']:.1f} s: "
        f"{result['copy_rate']:,.0f} tx/s; a member {result['until_joined']:.1f} s after "
        f"the change"
    )
    print(
        f"producer at {result['rate']:,.0f} tx/s ({args.load:.0%} of "
        f"{result['saturated']:,.0f}): {result['committed']:,} committed, longest gap "
        f"between commits {result['max_gap_ms']:.0f} ms, latency p50 "
        f"{result['p50_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms, max "
        f"{result['max_ms']:.0f} ms"
    )
    return 0
