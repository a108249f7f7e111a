"""``waltz server bench``: commit throughput and latency of one server over 3 storage nodes.

Starts a throw-away local cluster (embedded ZooKeeper, storage nodes, one
server), then drives it at the protocol level: each client connection mounts
one partition and keeps up to ``--window`` appends outstanding. An append's
latency runs from its send to the moment its header arrives on the feed,
which is when a client learns it committed. The client library adds its own
costs on top; ``waltz bench`` (with the library) measures those.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import platform
import tempfile
import time

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


def register(cmds: argparse._SubParsersAction) -> None:
    p = cmds.add_parser("bench", help="commit rate and latency of a server over 3 storage nodes")
    p.add_argument("--clients", type=int, default=4, help="client connections (default 4)")
    p.add_argument("--partitions", type=int, default=4, help="partitions (default 4)")
    p.add_argument("--transactions", type=int, default=100_000, help="in total (default 100000)")
    p.add_argument("--size", type=int, default=1024, help="bytes of data each (default 1024)")
    p.add_argument(
        "--window", type=int, default=500, help="outstanding appends per client (default 500)"
    )
    p.add_argument("--data-dir", help="cluster directory (default: a temporary one)")
    p.set_defaults(func=cmd_bench)


class _BenchClient:
    def __init__(self, client_id: int, partition: int, generation: int, window: int) -> None:
        self.client_id = client_id
        self.partition = partition
        self.generation = generation
        self.window = window
        self.sent_at: dict[int, float] = {}
        self.latencies: list[float] = []
        self.room = asyncio.Event()
        self.room.set()
        self.mounted: asyncio.Future[MountResponse] = asyncio.get_running_loop().create_future()

    def on_message(self, m: ClientMessage) -> None:
        if isinstance(m, FeedData):
            now = time.perf_counter()
            for h in m.headers:
                if h.req_id.client_id == self.client_id:
                    started = self.sent_at.pop(h.req_id.seq, None)
                    if started is not None:
                        self.latencies.append(now - started)
            if len(self.sent_at) < self.window:
                self.room.set()
        elif isinstance(m, MountResponse) and not self.mounted.done():
            self.mounted.set_result(m)

    async def run(self, port: int, count: int, payload: bytes) -> None:
        conn = await ServerConnection.connect("127.0.0.1", port, on_message=self.on_message)
        q = ReqId(self.client_id, self.generation, self.partition, 0)
        conn.send(MountRequest(q, -1, 1))
        if (await self.mounted).status != MountStatus.READY:
            raise RuntimeError(f"partition {self.partition} did not mount")
        # Start from the partition's current end: only this run's appends count.
        for seq in range(1, count + 1):
            while len(self.sent_at) >= self.window:
                self.room.clear()
                await self.room.wait()
            self.sent_at[seq] = time.perf_counter()
            conn.send(
                AppendRequest(
                    ReqId(self.client_id, self.generation, self.partition, seq),
                    -1,
                    (),
                    (),
                    (),
                    0,
                    payload,
                )
            )
            if seq % 64 == 0:
                await conn.drain()
        while self.sent_at:
            self.room.clear()
            await wait_for(self.room.wait(), 60)
        await conn.close()


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


async def _drive(cluster: LocalCluster, args: argparse.Namespace) -> dict:
    from waltz_client.cluster.admin import read_cluster
    from waltz_client.cluster.zk import close, connect

    zk = connect(cluster.zookeeper_connect)
    try:
        deadline = time.monotonic() + 60
        while True:
            owners = read_cluster(zk, cluster.layout.root).ownership.partitions
            if all(owner is not None for owner, _ in owners.values()):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("partitions were not assigned to the server")
            await asyncio.sleep(0.2)
    finally:
        close(zk)
    port = cluster.servers[0].ready["port"]
    ids = itertools.count(1)
    clients = [
        _BenchClient(next(ids), c % args.partitions, owners[c % args.partitions][1], args.window)
        for c in range(args.clients)
    ]
    per_client = args.transactions // args.clients
    payload = os.urandom(args.size)
    started = time.perf_counter()
    await asyncio.gather(*(c.run(port, per_client, payload) for c in clients))
    elapsed = time.perf_counter() - started
    latencies = sorted(x for c in clients for x in c.latencies)
    committed = len(latencies)
    return {
        "committed": committed,
        "seconds": elapsed,
        "tx_per_s": committed / elapsed,
        "mb_per_s": committed * args.size / elapsed / 1e6,
        "p50_ms": percentile(latencies, 0.50) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "p999_ms": percentile(latencies, 0.999) * 1000,
    }


def cmd_bench(args: argparse.Namespace) -> int:
    for name in ("clients", "partitions", "transactions", "window"):
        if getattr(args, name) < 1:
            print(f"waltz server bench: error: --{name} must be at least 1")
            return 2
    if args.size < 0:
        print("waltz server bench: error: --size must be at least 0")
        return 2
    with tempfile.TemporaryDirectory(prefix="waltz-bench-") as tmp:
        cluster = LocalCluster(
            args.data_dir or os.path.join(tmp, "cluster"),
            storages=3,
            partitions=args.partitions,
            replicas=3,
            servers=1,
        )
        print(f"starting a local cluster: 3 storage nodes, 1 server, {args.partitions} partitions")
        cluster.start()
        try:
            result = event_loop.run(_drive(cluster, args))
        finally:
            cluster.stop()
    print(
        f"{args.clients} clients, {args.partitions} partitions, {args.size}-byte transactions, "
        f"window {args.window}, on {os.cpu_count()} CPUs ({platform.machine()})"
    )
    print(
        f"committed {result['committed']} in {result['seconds']:.2f} s: "
        f"{result['tx_per_s']:,.0f} tx/s, {result['mb_per_s']:.1f} MB/s"
    )
    print(
        f"commit latency (send -> feed): p50 {result['p50_ms']:.2f} ms, "
        f"p99 {result['p99_ms']:.2f} ms, p999 {result['p999_ms']:.2f} ms"
    )
    return 0
