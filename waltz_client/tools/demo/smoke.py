"""``waltz smoke``: many clients append while a schedule kills, stops and pauses storage
nodes, servers and ZooKeeper; then the log's invariants are verified.

Checks, each printed PASS or FAIL with the reason:
- every acknowledged transaction was consumed exactly once by every consumer, at the
  transaction ID it was acknowledged with, carrying its own payload;
- every consumer received transaction IDs as high-water mark + 1, with no gap;
- every consumer saw the same order;
- no append whose submission failed appears in the log;
- a fresh client re-reads the whole log with a matching checksum, and again after a
  full restart of the cluster;
- every replica holds identical bytes for the committed prefix.
Never more than one storage node (a minority of three) is down at once.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import random
import time
from collections import defaultdict
from dataclasses import dataclass, field

from waltz_client.callbacks import WaltzClientCallbacks
from waltz_client.client import SubmitStatus, WaltzClient
from waltz_client.config import WaltzClientConfig
from waltz_client.runtime import event_loop
from waltz_client.tools.local.cli import add_security_flags
from waltz_client.tools.local.cluster import LocalCluster
from waltz_client.tools.local.verify import converged_digests
from waltz_client.transaction import Lock, Transaction, TransactionBuilder, TransactionContext
from waltz_client.wire.records import ReqId

from .common import FAST_FAILOVER, check_at_least_one, fresh_cluster


def register(groups: argparse._SubParsersAction) -> None:
    p = groups.add_parser("smoke", help="append under a schedule of faults, then verify the log")
    p.add_argument("--data-dir", default=".waltz-local/smoke", help="wiped and reused")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of load (default 30)")
    p.add_argument("--clients", type=int, default=3, help="clients (default 3)")
    p.add_argument("--writers", type=int, default=8, help="concurrent writers per client")
    p.add_argument("--partitions", type=int, default=2, help="partitions (default 2)")
    p.add_argument("--lock-pool", type=int, default=50, help="distinct write locks")
    p.add_argument("--fault-every", type=float, default=3.0, help="seconds between faults")
    p.add_argument("--seed", type=int, default=1, help="fault schedule and workload seed")
    add_security_flags(p)  # mutual TLS and ZooKeeper ACLs unless --insecure
    p.set_defaults(func=cmd_smoke)


def say(message: str) -> None:
    print(f"[waltz smoke] {message}", flush=True)


class Consumer(WaltzClientCallbacks):
    """Records the feed as delivered: (transaction ID, ReqId) per partition, and any gap."""

    def __init__(self) -> None:
        self.feed: dict[int, list[tuple[int, ReqId]]] = defaultdict(list)
        self.gaps: list[str] = []

    async def client_high_water_mark(self, partition_id: int) -> int:
        log = self.feed[partition_id]
        return log[-1][0] if log else -1

    async def apply_transaction(self, t: Transaction) -> None:
        log = self.feed[t.partition_id]
        expected = log[-1][0] + 1 if log else 0
        if t.transaction_id != expected:
            self.gaps.append(
                f"partition {t.partition_id}: got {t.transaction_id}, expected {expected}"
            )
        log.append((t.transaction_id, t.req_id))


@dataclass
class Append(TransactionContext):
    payload: bytes
    partition: int
    lock: Lock

    def partition_id(self, num_partitions: int) -> int:
        return self.partition

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_data(self.payload)
        builder.set_write_locks(self.lock)
        return True


@dataclass
class Results:
    acknowledged: dict[tuple[int, int], bytes] = field(default_factory=dict)
    failed: set[bytes] = field(default_factory=set)
    duplicates: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    attempts: int = 0
    submitted: int = 0


class FaultSchedule:
    """Random faults, one at a time, each undone before the next."""

    def __init__(self, cluster: LocalCluster, rng: random.Random) -> None:
        self.cluster = cluster
        self.rng = rng
        self.done: list[str] = []

    async def one(self) -> None:
        c = self.cluster
        kind = self.rng.choice(
            [
                "kill-storage",
                "stop-storage",
                "pause-storage",
                "kill-server",
                "pause-server",
                "pause-zookeeper",
                "restart-zookeeper",
            ]
        )
        if kind.endswith("storage"):
            proc = self.rng.choice(c.storages)
        elif kind.endswith("server"):
            proc = self.rng.choice(c.servers)
        else:
            proc = None
        hold = self.rng.uniform(0.5, 2.5)
        name = proc.name if proc is not None else "zookeeper"
        say(f"fault: {kind} {name} for {hold:.1f} s")
        self.done.append(f"{kind} {name}")
        if kind.startswith("kill") and proc is not None:
            proc.kill()
            await asyncio.sleep(hold)
            await asyncio.to_thread(proc.start)
        elif kind.startswith("stop") and proc is not None:
            await asyncio.to_thread(proc.stop)
            await asyncio.sleep(hold)
            await asyncio.to_thread(proc.start)
        elif kind.startswith("pause") and proc is not None:
            proc.pause()
            await asyncio.sleep(hold)
            proc.resume()
        elif kind == "pause-zookeeper" and c.zookeeper is not None:
            c.zookeeper.pause()
            await asyncio.sleep(hold)
            c.zookeeper.resume()
        elif kind == "restart-zookeeper" and c.zookeeper is not None:
            await asyncio.to_thread(c.zookeeper.restart)


async def _load(
    args: argparse.Namespace, cluster: LocalCluster, results: Results, consumers: list[Consumer]
) -> tuple[dict[int, int], float]:
    config = WaltzClientConfig(
        cluster.zookeeper_connect,
        zk_root=cluster.layout.root,
        max_retries=50,
        request_timeout=20.0,
        tls=cluster.client_tls,
        zk_tls=cluster.client_zk_tls,
    )
    clients = [WaltzClient(config, consumer) for consumer in consumers]
    for c in clients:
        await c.start()
    rng = random.Random(args.seed)
    stop = asyncio.Event()
    seen: set[bytes] = set()

    async def writer(c: WaltzClient, ci: int, wi: int) -> None:
        k = 0
        wrng = random.Random(args.seed * 1000 + ci * 100 + wi)
        while not stop.is_set():
            payload = f"client {ci} writer {wi} append {k}".encode()
            k += 1
            ctx = Append(
                payload,
                wrng.randrange(args.partitions),
                Lock("pool", wrng.randrange(args.lock_pool)),
            )
            t0 = time.perf_counter()
            results.submitted += 1
            r = await c.submit(ctx)
            results.attempts += r.attempts
            if r.status == SubmitStatus.COMMITTED:
                key = (ctx.partition, r.transaction_id)
                if key in results.acknowledged:
                    results.duplicates.append(f"{key} acknowledged twice")
                results.acknowledged[key] = payload
                results.latencies.append(time.perf_counter() - t0)
            else:
                results.failed.add(payload)
            assert payload not in seen
            seen.add(payload)

    async def faults() -> None:
        schedule = FaultSchedule(cluster, rng)
        while not stop.is_set():
            await asyncio.sleep(args.fault_every)
            if not stop.is_set():
                await schedule.one()

    started = time.perf_counter()
    tasks = [
        asyncio.create_task(writer(c, ci, wi))
        for ci, c in enumerate(clients)
        for wi in range(args.writers)
    ]
    fault_task = asyncio.create_task(faults())
    while time.perf_counter() - started < args.duration:
        await asyncio.sleep(2)
        say(
            f"{len(results.acknowledged)} acknowledged, {len(results.failed)} failed, "
            f"{len(results.acknowledged) / (time.perf_counter() - started):.0f} tx/s"
        )
    stop.set()
    await fault_task
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - started
    # Let every consumer reach the end of the log.
    hwms = {p: await clients[0].high_water_mark(p) for p in range(args.partitions)}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not all(
        c.applied_high_water_mark(p) >= hwms[p] for c in clients for p in hwms
    ):
        await asyncio.sleep(0.1)
    for c in clients:
        await c.close()
    return hwms, elapsed


async def _read_everything(cluster: LocalCluster, partitions: int):
    config = WaltzClientConfig(
        cluster.zookeeper_connect,
        zk_root=cluster.layout.root,
        feed=False,
        tls=cluster.client_tls,
        zk_tls=cluster.client_zk_tls,
    )
    digest = hashlib.sha256()
    records = {}
    async with WaltzClient(config) as reader:
        for p in range(partitions):
            records[p] = [r async for r in reader.read(p)]
            for r in records[p]:
                digest.update(r.encode())
    return records, digest.hexdigest()


async def _verify(
    args: argparse.Namespace,
    cluster: LocalCluster,
    results: Results,
    consumers: list[Consumer],
    hwms: dict[int, int],
) -> dict[str, str | None]:
    """name -> None when it holds, else why not."""
    problems: dict[str, str | None] = {}
    log, checksum = await _read_everything(cluster, args.partitions)

    def check(name: str, failures: list[str]) -> None:
        problems[name] = "; ".join(failures[:5]) + (" ..." if len(failures) > 5 else "") or None

    bad = []
    for (p, txid), payload in results.acknowledged.items():
        records = log[p]
        if txid >= len(records) or records[txid].data != payload:
            bad.append(f"partition {p} transaction {txid} is not {payload!r}")
    bad += results.duplicates
    for ci, consumer in enumerate(consumers):
        for p in range(args.partitions):
            ids = [t for t, _ in consumer.feed[p]]
            if ids != list(range(hwms[p] + 1)):
                bad.append(
                    f"client {ci} consumed partition {p} as {len(ids)} transactions, "
                    f"not 0..{hwms[p]}"
                )
    check("every acknowledged transaction consumed exactly once by every consumer", bad)
    check(
        "transaction IDs arrive as high-water mark + 1, no gap",
        [g for c in consumers for g in c.gaps],
    )
    check(
        "every consumer saw the same order",
        [
            f"client {ci} differs on partition {p}"
            for ci, c in enumerate(consumers)
            for p in range(args.partitions)
            if c.feed[p] != consumers[0].feed[p]
        ],
    )
    in_log = {r.data for records in log.values() for r in records}
    check(
        "no failed append appears in the log",
        [f"{payload!r} failed but is in the log" for payload in results.failed & in_log],
    )
    check(
        "the log holds each payload once",
        [] if sum(len(v) for v in log.values()) == len(in_log) else ["a payload appears twice"],
    )
    digests = await converged_digests(cluster, hwms)
    check(
        "every replica identical for the committed prefix",
        [
            f"partition {p}: {d}"
            for p, d in digests.items()
            if len(set(d)) != 1 or "incomplete" in d
        ],
    )
    say("restarting the whole cluster to read the log again")
    await asyncio.to_thread(cluster.stop)
    await asyncio.to_thread(cluster.start)
    _, again = await _read_everything(cluster, args.partitions)
    check(
        "a fresh client reads the same log before and after a full restart",
        [] if again == checksum else [f"checksum {checksum[:16]} != {again[:16]}"],
    )
    return problems


def cmd_smoke(args: argparse.Namespace) -> int:
    if not check_at_least_one("waltz smoke", args, "clients", "writers", "partitions", "lock_pool"):
        return 2
    if args.duration <= 0 or args.fault_every <= 0:
        print("waltz smoke: error: --duration and --fault-every must be positive")
        return 2
    cluster = fresh_cluster(
        args.data_dir,
        args.partitions,
        2,
        [*FAST_FAILOVER, "--storage-timeout", "2"],
        tls=not args.insecure,
    )
    say(f"starting a local cluster in {cluster.data_dir}")
    cluster.start(say)
    try:
        return event_loop.run(_smoke(args, cluster))
    finally:
        cluster.stop()


async def _smoke(args: argparse.Namespace, cluster: LocalCluster) -> int:
    results = Results()
    consumers = [Consumer() for _ in range(args.clients)]
    hwms, elapsed = await _load(args, cluster, results, consumers)
    problems = await _verify(args, cluster, results, consumers, hwms)
    lat = sorted(results.latencies)

    def pct(q: float) -> float:
        return lat[min(len(lat) - 1, int(q * len(lat)))] * 1000 if lat else float("nan")

    print()
    print("=== waltz smoke report ===")
    print(
        f"acknowledged {len(results.acknowledged)} of {results.submitted} submissions "
        f"({len(results.failed)} failed) in {elapsed:.1f} s: "
        f"{len(results.acknowledged) / elapsed:.0f} tx/s, "
        f"{results.attempts / max(1, results.submitted):.2f} attempts each"
    )
    print(f"commit latency p50 {pct(0.5):.1f} ms, p99 {pct(0.99):.1f} ms, p999 {pct(0.999):.1f} ms")
    print("high-water marks " + ", ".join(f"{p}: {h}" for p, h in sorted(hwms.items())))
    for name, why in problems.items():
        print(f"{'PASS' if why is None else 'FAIL'}  {name}" + (f": {why}" if why else ""))
    ok = all(why is None for why in problems.values())
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1
