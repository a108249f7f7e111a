"""``waltz bench``: producers and consumers through the client library on a local cluster.

Producers submit transactions (closed loop: a fixed number outstanding; open
loop: a fixed rate, whatever the latency) and measure submit-to-committed
latency. Then consumers mount from the start of the log and apply it (the
feed catching up), and a range reader reads it back with the data.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import time

from waltz_client.callbacks import WaltzClientCallbacks
from waltz_client.client import SubmitStatus, WaltzClient
from waltz_client.config import WaltzClientConfig
from waltz_client.runtime import event_loop
from waltz_client.tools.local.cli import add_security_flags
from waltz_client.tools.local.cluster import LocalCluster
from waltz_client.transaction import Lock, Transaction

from .common import Put, check_at_least_one, fresh_cluster, open_loop
from .scale_settings import SCALE_MODES, scale_only_given
from .scale_settings import option_help as scale_option_help


def register(groups: argparse._SubParsersAction) -> None:
    p = groups.add_parser("bench", help="producer and consumer rates through the client")
    p.add_argument("--data-dir", default=".waltz-local/bench", help="wiped and reused")
    p.add_argument("--transactions", type=int, default=50_000, help="in total (default 50000)")
    p.add_argument("--size", type=int, default=1024, help="bytes each (default 1024)")
    p.add_argument("--partitions", type=int, default=4, help="partitions (default 4)")
    p.add_argument("--clients", type=int, default=1, help="producer clients (default 1)")
    p.add_argument(
        "--concurrency", type=int, default=2000, help="closed loop: outstanding (default 2000)"
    )
    p.add_argument("--rate", type=float, default=0.0, help="open loop: tx/s (default closed)")
    p.add_argument("--lock-pool", type=int, default=0, help="write locks drawn from N ids")
    p.add_argument("--consumers", type=int, default=1, help="catch-up consumers (default 1)")
    add_security_flags(p)  # mutual TLS and ZooKeeper ACLs unless --insecure
    c = p.add_argument_group(
        "--compare",
        "a closed-loop sweep instead (docs/benchmarks.md): writes/s at each concurrency for "
        "waltz with 1 and 4 partitions and a local ZooKeeper ensemble, a fresh cluster a cell",
    )
    c.add_argument("--compare", action="store_true", help="run the sweep")
    c.add_argument("--compare-concurrency", default="1,16,64,256", help="writes in flight")
    c.add_argument("--compare-partitions", default="1,4", help="waltz partition counts")
    c.add_argument("--seconds", type=float, default=5.0, help="of load a cell (default 5)")
    c.add_argument("--runs", type=int, default=2, help="runs of each cell; median (default 2)")
    c.add_argument("--no-zookeeper", action="store_true", help="skip the ZooKeeper column")
    c.add_argument(
        "--zookeeper-members",
        type=int,
        default=3,
        help="ZooKeeper ensemble size (default 3, replicated like a waltz partition)",
    )
    c.add_argument(
        "--no-etcd", action="store_true", help="skip the etcd column (run where etcd is on PATH)"
    )
    c.add_argument(
        "--etcd-members",
        type=int,
        default=3,
        help="etcd cluster size (default 3, replicated like a waltz partition)",
    )
    c.add_argument("--json", metavar="PATH", help="also write every cell as JSON")
    c.add_argument(
        "--floor",
        action="store_true",
        help="instead: what this machine allows a replicated write at C=1 with no logic "
        "(client, relay and 3 syncing nodes; uses --size, --seconds, --runs)",
    )
    help_of = scale_option_help()
    s = p.add_argument_group(
        "--scale",
        "how the cost grows instead (docs/benchmarks.md, Scale curve): one mode, a fresh "
        "local cluster a cell; also takes --seconds (idle-clients: the idle period, default "
        "10), --runs, --size and --json; idle-clients and failover run on mutual TLS unless "
        "--insecure",
    )
    s.add_argument("--scale", choices=SCALE_MODES, help=help_of["scale"])
    s.add_argument("--scale-partitions", metavar="N,...", help=help_of["scale_partitions"])
    s.add_argument("--scale-concurrency", metavar="C,...", help=help_of["scale_concurrency"])
    s.add_argument("--scale-clients", metavar="N,...", help=help_of["scale_clients"])
    s.add_argument(
        "--scale-session-timeout", type=float, metavar="S", help=help_of["scale_session_timeout"]
    )
    p.set_defaults(func=cmd_bench, sweep_defaults={n: p.get_default(n) for n in SWEEP_ONLY})


class _Counter(WaltzClientCallbacks):
    def __init__(self) -> None:
        self.hwm: dict[int, int] = {}
        self.count = 0

    async def client_high_water_mark(self, partition_id: int) -> int:
        return self.hwm.get(partition_id, -1)

    async def apply_transaction(self, transaction: Transaction) -> None:
        self.hwm[transaction.partition_id] = transaction.transaction_id
        self.count += 1


def _pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] * 1000 if values else float("nan")


async def _produce(args: argparse.Namespace, cluster: LocalCluster) -> dict:
    config = WaltzClientConfig(
        cluster.zookeeper_connect,
        zk_root=cluster.layout.root,
        feed=False,
        max_outstanding_appends=max(1, args.concurrency),
        max_retries=1000,
        transaction_timeout=None,  # keep trying through any outage it measures
        tls=cluster.client_tls,
        zk_tls=cluster.client_zk_tls,
    )
    clients = [WaltzClient(config) for _ in range(args.clients)]
    for c in clients:
        await c.start()
        for p in range(args.partitions):  # mount before the clock starts
            await c.submit(Put(p, b"warm-up", None))
    payload = os.urandom(args.size)
    rng = random.Random(1)
    latencies: list[float] = []
    attempts = 0
    failed = 0

    async def one(i: int) -> None:
        nonlocal attempts, failed
        lock = Lock("bench", rng.randrange(args.lock_pool)) if args.lock_pool else None
        ctx = Put(i % args.partitions, payload, lock)
        t0 = time.perf_counter()
        r = await clients[i % len(clients)].submit(ctx)
        attempts += r.attempts
        if r.status == SubmitStatus.COMMITTED:
            latencies.append(time.perf_counter() - t0)
        else:
            failed += 1

    started = time.perf_counter()
    cpu_started = time.process_time()  # this process runs only the clients
    if args.rate > 0:
        await open_loop(args.rate, args.transactions, one)
    else:
        queue = iter(range(args.transactions))

        async def worker() -> None:
            for i in queue:
                await one(i)

        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    for c in clients:
        await c.close()
    latencies.sort()
    n = len(latencies)
    return {
        "committed": n,
        "failed": failed,
        "seconds": elapsed,
        "tx_per_s": n / elapsed,
        "mb_per_s": n * args.size / elapsed / 1e6,
        "retries_per_tx": (attempts - args.transactions) / max(1, args.transactions),
        "client_cpu_us_per_tx": cpu * 1e6 / max(1, n),
        "p50": _pct(latencies, 0.5),
        "p99": _pct(latencies, 0.99),
        "p999": _pct(latencies, 0.999),
    }


async def _consume(args: argparse.Namespace, cluster: LocalCluster, total: int) -> dict:
    config = WaltzClientConfig(
        cluster.zookeeper_connect,
        zk_root=cluster.layout.root,
        tls=cluster.client_tls,
        zk_tls=cluster.client_zk_tls,
    )
    counters = [_Counter() for _ in range(args.consumers)]
    started = time.perf_counter()
    cpu_started = time.process_time()
    clients = [WaltzClient(config, counter) for counter in counters]
    for c in clients:
        await c.start()
    while any(counter.count < total for counter in counters):
        await asyncio.sleep(0.01)
    feed_seconds = time.perf_counter() - started
    feed_cpu = time.process_time() - cpu_started
    read_started = time.perf_counter()
    read = 0
    for p in range(args.partitions):
        async for _ in clients[0].read(p):
            read += 1
    read_seconds = time.perf_counter() - read_started
    for c in clients:
        await c.close()
    return {
        "feed_tx_per_s": total * args.consumers / feed_seconds,
        "feed_cpu_us_per_tx": feed_cpu * 1e6 / (total * args.consumers),
        "read_tx_per_s": read / read_seconds,
        "read_mb_per_s": read * args.size / read_seconds / 1e6,
    }


# Options of the sweep alone, by their argparse names.
SWEEP_ONLY = (
    "compare_concurrency",
    "compare_partitions",
    "seconds",
    "runs",
    "no_zookeeper",
    "zookeeper_members",
    "no_etcd",
    "etcd_members",
    "json",
)


def cmd_bench(args: argparse.Namespace) -> int:
    if args.scale is not None:
        from .scale import cmd_scale

        return cmd_scale(args)
    scaled = scale_only_given(args)
    if scaled:
        print(f"waltz bench: error: {', '.join(scaled)} only apply with --scale")
        return 2
    if args.compare and args.floor:
        print("waltz bench: error: --compare and --floor are two separate measurements")
        return 2
    if args.compare:
        from .compare import cmd_compare

        return cmd_compare(args)
    if args.floor:
        from .floor import cmd_floor

        return cmd_floor(args)
    given = [n for n in SWEEP_ONLY if getattr(args, n) != args.sweep_defaults[n]]
    if given:
        flags = ", ".join("--" + n.replace("_", "-") for n in given)
        also = " or --floor" if set(given) <= {"seconds", "runs"} else ""
        print(f"waltz bench: error: {flags} only apply with --compare (the sweep){also}")
        return 2
    names = ("transactions", "partitions", "clients", "concurrency", "consumers")
    if not check_at_least_one("waltz bench", args, *names):
        return 2
    if args.size < 0 or args.rate < 0 or args.lock_pool < 0:
        print("waltz bench: error: --size, --rate and --lock-pool must not be negative")
        return 2
    cluster = fresh_cluster(args.data_dir, args.partitions, 1, [], tls=not args.insecure)
    print(f"starting a local cluster: 3 storage nodes, 1 server, {args.partitions} partitions")
    cluster.start()
    try:
        produced = event_loop.run(_produce(args, cluster))
        total = produced["committed"] + args.clients * args.partitions  # with the warm-ups
        consumed = event_loop.run(_consume(args, cluster, total))
    finally:
        cluster.stop()
    mode = f"open loop at {args.rate:g} tx/s" if args.rate else f"{args.concurrency} outstanding"
    print(
        f"{args.clients} producer client(s), {args.partitions} partitions, {args.size}-byte "
        f"transactions, {mode}, lock pool {args.lock_pool or 'none'}; "
        f"{os.cpu_count()} CPUs ({platform.machine()}), fsync on"
    )
    print(
        f"committed {produced['committed']} in {produced['seconds']:.2f} s: "
        f"{produced['tx_per_s']:,.0f} tx/s, {produced['mb_per_s']:.1f} MB/s, "
        f"{produced['retries_per_tx']:.3f} retries/tx, {produced['failed']} failed"
    )
    print(
        f"commit latency (submit -> committed): p50 {produced['p50']:.2f} ms, "
        f"p99 {produced['p99']:.2f} ms, p999 {produced['p999']:.2f} ms"
    )
    print(
        f"consumers catching up from the start: {consumed['feed_tx_per_s']:,.0f} tx/s "
        f"({args.consumers} consumer(s)); range read with data: "
        f"{consumed['read_tx_per_s']:,.0f} tx/s, {consumed['read_mb_per_s']:.1f} MB/s"
    )
    # What the client library itself costs, apart from the cluster sharing the machine.
    print(
        f"client CPU: {produced['client_cpu_us_per_tx']:.1f} us a committed transaction "
        f"(producing), {consumed['feed_cpu_us_per_tx']:.1f} us a row (catching up)"
    )
    return 0
