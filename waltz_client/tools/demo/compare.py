"""``waltz bench --compare``: the closed-loop sweep of issue 16, as a user can rerun it.

For each system (waltz with 1 partition, waltz with 4, and a ZooKeeper ensemble of 3
members by default, replicated like a waltz partition) and each concurrency C, a fresh
local cluster, then load processes (2, or 1 at C=1) keep C writes of ``--size`` bytes in
flight between them for ``--seconds``, closed loop: each write is sent when one
completes. A waltz write is a transaction submitted through ``WaltzClient``
(committed: fsync'd on 2 of 3 replicas); a ZooKeeper write is a ``create`` of a
sequential node (committed: fsync'd in the transaction logs of a majority
of the members). Reported per cell: the median over ``--runs`` of the completed writes
per second, and the latency percentiles; and at the highest C, the CPU the cluster's own
processes (storage nodes and server, or ZooKeeper's JVMs) spent per write. A second
table splits each cell's CPU a write by process: the server, each storage node, each
ZooKeeper member, each load process (the client library's share).
"""

from __future__ import annotations

import asyncio
import json
import math
import multiprocessing
import os
import platform
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from waltz_client.runtime import event_loop
from waltz_client.runtime.process_cpu import cpu_seconds
from waltz_client.tools.local.zookeeper_ensemble import ZooKeeperEnsemble
from waltz_client.wire.native import describe as describe_loops

from .common import Put, WritesMeasured, fresh_cluster

if TYPE_CHECKING:
    import argparse
    from multiprocessing.queues import Queue
    from multiprocessing.synchronize import Barrier

    from kazoo.interfaces import IAsyncResult

# What a load process puts on its queue: (writes, their latencies in ms, what wrote).
LoadResult = tuple[int, list[float], str]

DEFAULT_CONCURRENCY = (1, 16, 64, 256)
WALTZ_SYSTEMS = ("waltz, 1 partition", "waltz, 4 partitions")
DEFAULT_ZOOKEEPER_MEMBERS = 3


def zookeeper_system(members: int) -> str:
    return f"zookeeper ({members} member{'s' if members > 1 else ''})"


ZOOKEEPER = zookeeper_system(DEFAULT_ZOOKEEPER_MEMBERS)
LOAD = "load"  # the role of the load processes, whose CPU is not the cluster's


@dataclass
class Cell(WritesMeasured):
    """One run of one system at one concurrency."""

    system: str
    concurrency: int
    writes: int
    seconds: float
    latencies_ms: list[float] = field(repr=False)
    cluster_cpu_s: float
    # CPU seconds and process count of each role ("server", "storage", "zookeeper",
    # LOAD): where a write's CPU goes.
    role_cpu_s: dict[str, float] = field(default_factory=dict)
    role_processes: dict[str, int] = field(default_factory=dict)
    run: int = 0  # which run of the sweep (0 first): cells of one run are measured together
    # What the load processes wrote through: "WaltzClient on uvloop", "kazoo (threads)".
    load_client: str = ""

    @property
    def cpu_ms_per_write(self) -> float:
        return 1000 * self.cluster_cpu_s / max(1, self.writes)

    def cpu_split(self) -> str:
        """Each role's CPU a write, a process of it: "server 61 us, storage 3 x 48 us"."""
        parts = []
        for role, used in self.role_cpu_s.items():
            n = self.role_processes.get(role, 1)
            each = 1e6 * used / max(1, n) / max(1, self.writes)
            parts.append(f"{role} {n} x {each:.0f} us" if n > 1 else f"{role} {each:.0f} us")
        return ", ".join(parts)


# --- load processes ---------------------------------------------------------------------


def _waltz_load(
    zookeeper: str,
    root: str,
    partitions: int,
    inflight: int,
    size: int,
    ready: Barrier,
    seconds: float,
    out: Queue[LoadResult],
) -> None:
    from waltz_client.client import SubmitStatus, WaltzClient
    from waltz_client.config import WaltzClientConfig

    async def main() -> LoadResult:
        config = WaltzClientConfig(
            zookeeper, zk_root=root, feed=False, max_outstanding_appends=max(1, inflight)
        )
        async with WaltzClient(config) as client:
            for p in range(partitions):  # mounted before the clock starts
                await client.submit(Put(p, b"warm-up", None))
            payload = os.urandom(size)
            latencies: list[float] = []
            await asyncio.to_thread(ready.wait, 120)  # every load process connected
            stop_at = time.time() + seconds
            counter = iter(range(1 << 62))

            async def slot() -> None:
                while time.time() < stop_at:
                    t0 = time.perf_counter()
                    r = await client.submit(Put(next(counter) % partitions, payload, None))
                    if r.status == SubmitStatus.COMMITTED and time.time() <= stop_at:
                        latencies.append((time.perf_counter() - t0) * 1000)

            await asyncio.gather(*(slot() for _ in range(inflight)))
            loop = type(asyncio.get_running_loop())
            kind = "uvloop" if loop.__module__.startswith("uvloop") else "asyncio"
            return len(latencies), latencies, f"WaltzClient on {kind}"

    out.put(event_loop.run(main()))


def _zookeeper_load(
    zookeeper: str,
    root: str,
    partitions: int,
    inflight: int,
    size: int,
    ready: Barrier,
    seconds: float,
    out: Queue[LoadResult],
) -> None:
    from kazoo.client import KazooClient

    zk = KazooClient(hosts=zookeeper, timeout=30)
    zk.start(30)
    zk.ensure_path(f"{root}/bench")
    payload = os.urandom(size)
    latencies: list[float] = []
    lock = threading.Lock()
    done = threading.Event()
    live = [inflight]
    stop_at = 0.0

    def send() -> None:
        t0 = time.perf_counter()
        result = zk.create_async(f"{root}/bench/n-", payload, sequence=True)
        result.rawlink(lambda r: finished(r, t0))

    def finished(result: IAsyncResult, t0: float) -> None:
        ok = result.successful()
        now = time.time()
        with lock:
            if ok and now <= stop_at:
                latencies.append((time.perf_counter() - t0) * 1000)
            if now < stop_at:
                send_again = True
            else:
                send_again = False
                live[0] -= 1
                if live[0] == 0:
                    done.set()
        if send_again:
            send()

    ready.wait(120)  # every load process connected
    stop_at = time.time() + seconds
    for _ in range(inflight):
        send()
    done.wait(seconds + 60)
    zk.stop()
    zk.close()
    out.put((len(latencies), latencies, "kazoo (threads)"))


def measure(
    system: str,
    target: Callable,
    connect: tuple,
    roles: dict[str, list[int]],
    concurrency: int,
    size: int,
    seconds: float,
) -> Cell:
    """``concurrency`` writes in flight over 2 load processes (1 at C=1), which start
    together once all are connected, for ``seconds``; the CPU that the cluster's
    processes (``roles``: their pids by role) and the load processes spend meanwhile."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    half = concurrency // 2
    shares = [concurrency] if concurrency == 1 else [half, concurrency - half]
    ready = ctx.Barrier(len(shares) + 1)
    procs = [
        ctx.Process(target=target, args=(*connect, share, size, ready, seconds, out))
        for share in shares
    ]
    for proc in procs:
        proc.start()
    try:
        ready.wait(180)
        watched = {**roles, LOAD: [p.pid for p in procs if p.pid is not None]}
        cpu_before = {role: cpu_seconds(pids) for role, pids in watched.items()}
        time.sleep(seconds)
        role_cpu = {role: cpu_seconds(pids) - cpu_before[role] for role, pids in watched.items()}
        results = [out.get(timeout=120) for _ in procs]
    finally:
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
    writes = sum(n for n, _, _ in results)
    latencies = sorted(x for _, lat, _ in results for x in lat)
    cluster_cpu = sum(used for role, used in role_cpu.items() if role != LOAD)
    counts = {role: len(pids) for role, pids in watched.items()}
    client = " and ".join(sorted({c for _, _, c in results}))
    return Cell(
        system,
        concurrency,
        writes,
        seconds,
        latencies,
        cluster_cpu,
        role_cpu,
        counts,
        load_client=client,
    )


def measure_waltz(
    data_dir: str, partitions: int, concurrency: int, size: int, seconds: float
) -> Cell:
    cluster = fresh_cluster(data_dir, partitions, 1, [])
    cluster.start()
    try:
        roles = {
            "server": [p.pid for p in cluster.servers if p.pid is not None],
            "storage": [p.pid for p in cluster.storages if p.pid is not None],
        }
        connect = (cluster.zookeeper_connect, cluster.layout.root, partitions)
        system = WALTZ_SYSTEMS[0] if partitions == 1 else f"waltz, {partitions} partitions"
        return measure(system, _waltz_load, connect, roles, concurrency, size, seconds)
    finally:
        cluster.stop()


def measure_zookeeper(
    data_dir: str,
    concurrency: int,
    size: int,
    seconds: float,
    members: int = DEFAULT_ZOOKEEPER_MEMBERS,
) -> Cell:
    shutil.rmtree(data_dir, ignore_errors=True)
    os.makedirs(data_dir)
    ensemble = ZooKeeperEnsemble(data_dir, members)
    ensemble.start()
    try:
        connect = (ensemble.connect_string, "/compare", 0)
        system = zookeeper_system(members)
        roles = {"zookeeper": ensemble.pids}
        return measure(system, _zookeeper_load, connect, roles, concurrency, size, seconds)
    finally:
        ensemble.stop()


# --- the sweep and its table ------------------------------------------------------------


def sweep(
    data_dir: str,
    partitions: list[int],
    concurrency: list[int],
    size: int,
    seconds: float,
    runs: int,
    zookeeper: bool,
    say: Callable[[str], None] = print,
    zookeeper_members: int = DEFAULT_ZOOKEEPER_MEMBERS,
) -> list[Cell]:
    cells: list[Cell] = []
    for run in range(runs):
        for c in concurrency:
            plan = [(p, None) for p in partitions] + ([(0, "zk")] if zookeeper else [])
            for p, kind in plan:
                if kind == "zk":
                    cell = measure_zookeeper(
                        os.path.join(data_dir, "zk"), c, size, seconds, zookeeper_members
                    )
                else:
                    cell = measure_waltz(os.path.join(data_dir, "waltz"), p, c, size, seconds)
                cell.run = run
                cells.append(cell)
                say(
                    f"run {run + 1}/{runs} {cell.system:22s} C={c:<4d} "
                    f"{cell.rate:10,.0f} writes/s  p50 {cell.percentile(0.5):7.2f} ms  "
                    f"p99 {cell.percentile(0.99):7.2f} ms  "
                    f"cluster CPU {cell.cpu_ms_per_write:.3f} ms/write ({cell.cpu_split()})"
                )
    return cells


def median_cell(cells: list[Cell]) -> Cell:
    """The run with the median rate (the upper one of an even count)."""
    ordered = sorted(cells, key=lambda cell: cell.rate)
    return ordered[len(ordered) // 2]


def table(cells: list[Cell], concurrency: list[int]) -> str:
    systems = list(dict.fromkeys(cell.system for cell in cells))
    top = max(concurrency)
    head = ["system", *(f"C={c} writes/s" for c in concurrency)]
    head += [f"C={top} p99 ms", "C=1 p50 ms", f"cluster CPU ms/write at C={top}"]
    rows = [head, ["---"] + ["---:"] * (len(head) - 1)]
    for system in systems:
        mine = {
            c: median_cell([x for x in cells if x.system == system and x.concurrency == c])
            for c in concurrency
        }
        row = [system, *(f"{mine[c].rate:,.0f}" for c in concurrency)]
        row.append(f"{mine[top].percentile(0.99):.1f}")
        row.append(f"{mine[1].percentile(0.5):.2f}" if 1 in mine else "")
        row.append(f"{mine[top].cpu_ms_per_write:.3f}")
        rows.append(row)
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


def cpu_table(cells: list[Cell], concurrency: list[int]) -> str:
    """Where a write's CPU goes, a process of each role, in the median run of each cell."""
    systems = list(dict.fromkeys(cell.system for cell in cells))
    head = ["CPU a write, a process", *(f"C={c}" for c in concurrency)]
    rows = [head, ["---"] * len(head)]
    for system in systems:
        row = [system]
        for c in concurrency:
            mine = [x for x in cells if x.system == system and x.concurrency == c]
            row.append(median_cell(mine).cpu_split() if mine else "")
        rows.append(row)
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


def ratios(cells: list[Cell]) -> list[str]:
    """Issue 16's ratios at each concurrency: waltz with more partitions against one
    partition, and waltz with one partition against ZooKeeper; of the median cells, and
    with several runs, of each run's own cells too. A run measures the systems minutes
    apart at most, so its ratio is spared the machine's drift between runs, which the
    spread of the runs' ratios shows."""
    one = WALTZ_SYSTEMS[0]
    runs = sorted({x.run for x in cells})
    lines = []
    for c in sorted({x.concurrency for x in cells}):
        at_c = [x for x in cells if x.concurrency == c]
        systems = dict.fromkeys(x.system for x in at_c)
        if one not in systems:
            continue
        for s in systems:
            if s == one:
                continue
            top, bottom = (one, s) if s.startswith("zookeeper") else (s, one)
            line = f"C={c}: {top} / {bottom} = {_ratio(at_c, top, bottom):.2f}x"
            if len(runs) > 1:
                each = [_ratio([x for x in at_c if x.run == r], top, bottom) for r in runs]
                known = [f"{r:.2f}x" for r in each if not math.isnan(r)]  # a run lacks a cell
                line += f" (each run: {', '.join(known)})"
            lines.append(line)
    return lines


def _ratio(cells: list[Cell], top: str, bottom: str) -> float:
    """The median rate of ``top`` over that of ``bottom`` among ``cells``; NaN when
    either has none."""
    tops = [x for x in cells if x.system == top]
    bottoms = [x for x in cells if x.system == bottom]
    if not tops or not bottoms:
        return float("nan")
    return median_cell(tops).rate / median_cell(bottoms).rate


def cmd_compare(args: argparse.Namespace) -> int:
    try:
        concurrency = sorted({int(c) for c in args.compare_concurrency.split(",")})
        partitions = sorted({int(p) for p in args.compare_partitions.split(",")})
    except ValueError:
        print(
            "waltz bench: error: --compare-concurrency and --compare-partitions take "
            "comma-separated integers, e.g. 1,16,64,256"
        )
        return 2
    if (
        min(concurrency) < 1
        or min(partitions) < 1
        or args.runs < 1
        or args.seconds <= 0
        or args.zookeeper_members < 1
    ):
        print(
            "waltz bench: error: concurrency, partitions, --runs and --zookeeper-members "
            "must be at least 1, --seconds above 0"
        )
        return 2
    print(
        f"waltz bench --compare: closed loop, {args.size}-byte writes, {args.seconds:g} s a "
        f"cell, {args.runs} run(s), a fresh cluster each; {os.cpu_count()} CPUs "
        f"({platform.machine()}), fsync on, per-record loops {describe_loops()}, waltz's "
        f"load on {event_loop.describe()}",
        flush=True,
    )
    cells = sweep(
        args.data_dir,
        partitions,
        concurrency,
        args.size,
        args.seconds,
        args.runs,
        not args.no_zookeeper,
        lambda line: print(line, flush=True),
        args.zookeeper_members,
    )
    print()
    print(f"median of {args.runs} run(s):")
    print(table(cells, concurrency))
    for line in ratios(cells):
        print(line)
    print()
    print(cpu_table(cells, concurrency))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                [
                    {
                        **asdict(c),
                        "latencies_ms": None,
                        "rate": c.rate,
                        "p50_ms": c.percentile(0.5),
                        "p99_ms": c.percentile(0.99),
                        "cpu_ms_per_write": c.cpu_ms_per_write,
                    }
                    for c in cells
                ],
                f,
                indent=1,
            )
    return 0
