"""``waltz bench --compare``: the closed-loop sweep of issue 16, as a user can rerun it.

For each system (waltz with 1 partition, waltz with 4, a ZooKeeper ensemble of 3
members by default, and an etcd cluster of 3 members by default where ``etcd`` is on
PATH, each peer replicated like a waltz partition) and each concurrency C, a fresh
local cluster, then load processes (2, or 1 at C=1) keep C writes of ``--size`` bytes in
flight between them for ``--seconds``, closed loop: each write is sent when one
completes. A waltz write is a transaction submitted through ``WaltzClient``
(committed: fsync'd on 2 of 3 replicas); a ZooKeeper write is a ``create`` of a
sequential node (committed: fsync'd in the transaction logs of a majority
of the members); an etcd write is a put of a fresh key (committed: fsync'd in the
write-ahead logs of a majority of the members). Reported per cell: the median over
``--runs`` of the completed writes per second, and the latency percentiles; and at the
highest C, the CPU the cluster's own processes (storage nodes and server, ZooKeeper's
JVMs, or the etcd members) spent per write. A second table splits each cell's CPU a
write by process: the server, each storage node, each ZooKeeper or etcd member, each
load process (the client library's share).

How each load process keeps its writes in flight differs with the client each system
has. Waltz's ``WaltzClient`` pipelines every write over one connection to the server;
kazoo pipelines every ``create`` over its one session's connection to a ZooKeeper
member (picked at random; a follower forwards writes to the leader). etcd is measured
through its v3 JSON gateway (``POST /v3/kv/put``, key and value in base64) over
keep-alive HTTP/1.1 connections, which carry one request at a time: a load process with
W writes in flight opens W connections (at least one to each member, at most
``ETCD_MAX_CONNECTIONS``; above that, writes wait in the process for a free
connection), and sends each write on the connection idle longest. That spreads the
writes round robin over the members, as etcd's own Go client (clientv3) balances its
requests over its endpoints by default; a follower forwards a put to the leader. What
the JSON gateway costs etcd: each member decodes the JSON and passes the request on to
its own gRPC server over a loopback connection, a hop that etcd's Go client, speaking
gRPC over HTTP/2, does not take.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
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
from waltz_client.tools.local.etcd_ensemble import EtcdEnsemble, find_etcd
from waltz_client.tools.local.zookeeper_ensemble import ZooKeeperEnsemble
from waltz_client.wire.native import describe as describe_loops

from .common import Put, WritesMeasured, fresh_cluster

if TYPE_CHECKING:
    import argparse
    from multiprocessing.queues import Queue
    from multiprocessing.synchronize import Barrier

    from kazoo.interfaces import IAsyncResult

    from waltz_client.config import WaltzClientConfig

# What a load process puts on its queue: (writes, their latencies in ms, what wrote).
LoadResult = tuple[int, list[float], str]

DEFAULT_CONCURRENCY = (1, 16, 64, 256)
WALTZ_SYSTEMS = ("waltz, 1 partition", "waltz, 4 partitions")
DEFAULT_ZOOKEEPER_MEMBERS = 3


def zookeeper_system(members: int) -> str:
    return f"zookeeper ({members} member{'s' if members > 1 else ''})"


ZOOKEEPER = zookeeper_system(DEFAULT_ZOOKEEPER_MEMBERS)
DEFAULT_ETCD_MEMBERS = 3
# HTTP/1.1 connections a load process opens to etcd at most: the default sweep's 256
# writes in flight over 2 processes have one each.
ETCD_MAX_CONNECTIONS = 256


def etcd_system(members: int) -> str:
    return f"etcd ({members} member{'s' if members > 1 else ''})"


ETCD = etcd_system(DEFAULT_ETCD_MEMBERS)
PEERS = ("zookeeper", "etcd")  # how the peers' system names start


def is_peer(system: str) -> bool:
    return system.startswith(PEERS)


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


async def closed_loop_writes(
    config: WaltzClientConfig,
    partitions: int,
    inflight: int,
    size: int,
    ready: Barrier,
    seconds: float,
) -> tuple[list[float], str]:
    """``inflight`` writes in flight through one WaltzClient for ``seconds`` once every
    load process is ready: the latencies of those committed in time, and the event loop
    it ran on ("uvloop", "asyncio"). Shared by the sweep's and the TLS bench's loads."""
    from waltz_client.client import SubmitStatus, WaltzClient

    async with WaltzClient(config) as client:
        for p in range(partitions):  # mounted (and any handshake made) before the clock
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
        return latencies, "uvloop" if loop.__module__.startswith("uvloop") else "asyncio"


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
    from waltz_client.config import WaltzClientConfig

    async def main() -> LoadResult:
        config = WaltzClientConfig(
            zookeeper, zk_root=root, feed=False, max_outstanding_appends=max(1, inflight)
        )
        latencies, kind = await closed_loop_writes(
            config, partitions, inflight, size, ready, seconds
        )
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


class EtcdConnection:
    """One keep-alive HTTP/1.1 connection to an etcd member's JSON gateway, on asyncio
    streams: a request at a time, reconnecting after a failure."""

    def __init__(self, url: str) -> None:
        host, _, port = url.removeprefix("http://").rstrip("/").rpartition(":")
        self.host, self.port = host, int(port)
        self._head = f"Host: {host}:{port}\r\nContent-Type: application/json\r\n".encode()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """The status and body of ``POST path``; status 0 if the connection failed
        (closed, to be opened again by the next request)."""
        try:
            if self._writer is None:
                self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
            assert self._reader is not None
            self._writer.write(
                b"POST %s HTTP/1.1\r\n%sContent-Length: %d\r\n\r\n%s"
                % (path.encode(), self._head, len(body), body)
            )
            head = await self._reader.readuntil(b"\r\n\r\n")
            status, headers = _parse_head(head)
            if headers.get("transfer-encoding", "").lower() == "chunked":
                data = await self._read_chunks(self._reader)
            else:
                data = await self._reader.readexactly(int(headers.get("content-length", "0")))
            if headers.get("connection", "").lower() == "close":
                self.close()
            return status, data
        except (OSError, EOFError, ValueError, IndexError, asyncio.LimitOverrunError):
            self.close()
            return 0, b""

    @staticmethod
    async def _read_chunks(reader: asyncio.StreamReader) -> bytes:
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":
                    pass  # trailers, up to the empty line
                return b"".join(parts)
            parts.append((await reader.readexactly(size + 2))[:-2])  # less its CRLF

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    """The status code and the headers (names in lower case) of a response's head."""
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return status, headers


def etcd_put_body(key: bytes, value_b64: bytes) -> bytes:
    """The JSON of a v3 ``PutRequest`` (``value_b64``: the value already in base64)."""
    return b'{"key":"%s","value":"%s"}' % (base64.b64encode(key), value_b64)


def _etcd_load(
    endpoints: str,
    root: str,
    partitions: int,
    inflight: int,
    size: int,
    ready: Barrier,
    seconds: float,
    out: Queue[LoadResult],
) -> None:
    """``inflight`` puts of fresh keys in flight through etcd's JSON gateway, over
    ``min(max(inflight, members), ETCD_MAX_CONNECTIONS)`` connections spread over the
    members (``endpoints``: their comma-separated client URLs); a put is sent on the
    connection idle longest, so the writes go round robin over the members."""

    async def main() -> LoadResult:
        urls = endpoints.split(",")
        count = min(max(inflight, len(urls)), ETCD_MAX_CONNECTIONS)
        first = os.getpid() % len(urls)  # the load processes start on different members
        connections = [EtcdConnection(urls[(first + i) % len(urls)]) for i in range(count)]
        value = base64.b64encode(os.urandom(size))
        prefix = f"{root}/bench/{os.getpid()}-".encode()
        warm = await asyncio.gather(
            *(
                conn.post("/v3/kv/put", etcd_put_body(prefix + b"warm-%d" % i, value))
                for i, conn in enumerate(connections)
            )
        )  # every connection open and answered before the clock starts
        if any(status != 200 for status, _ in warm):
            bad = next(f"{status} {body[:200]!r}" for status, body in warm if status != 200)
            raise RuntimeError(f"etcd refused a warm-up put: {bad}")
        idle: asyncio.Queue[EtcdConnection] = asyncio.Queue()
        for conn in connections:
            idle.put_nowait(conn)
        latencies: list[float] = []
        await asyncio.to_thread(ready.wait, 120)  # every load process connected
        stop_at = time.time() + seconds
        counter = itertools.count()

        async def slot() -> None:
            while time.time() < stop_at:
                t0 = time.perf_counter()
                conn = await idle.get()
                try:
                    body = etcd_put_body(prefix + b"%d" % next(counter), value)
                    status, _ = await conn.post("/v3/kv/put", body)
                finally:
                    idle.put_nowait(conn)
                if status == 200 and time.time() <= stop_at:
                    latencies.append((time.perf_counter() - t0) * 1000)
                elif status == 0:
                    await asyncio.sleep(0.01)  # the member went away: not in a hot loop

        await asyncio.gather(*(slot() for _ in range(inflight)))
        for conn in connections:
            conn.close()
        loop = type(asyncio.get_running_loop())
        kind = "uvloop" if loop.__module__.startswith("uvloop") else "asyncio"
        return len(latencies), latencies, f"HTTP/1.1 JSON gateway on {kind}"

    out.put(event_loop.run(main()))


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


def measure_etcd(
    data_dir: str,
    concurrency: int,
    size: int,
    seconds: float,
    members: int = DEFAULT_ETCD_MEMBERS,
) -> Cell:
    shutil.rmtree(data_dir, ignore_errors=True)
    os.makedirs(data_dir)
    ensemble = EtcdEnsemble(data_dir, members)
    ensemble.start()
    try:
        connect = (",".join(ensemble.client_urls), "/compare", 0)
        roles = {"etcd": ensemble.pids}
        cell = measure(etcd_system(members), _etcd_load, connect, roles, concurrency, size, seconds)
        ensemble.check_running()  # a member that died meanwhile: its log, not a low figure
        return cell
    finally:
        ensemble.stop()


def etcd_missing() -> str | None:
    """Why the etcd column cannot run here (one line), or None if it can."""
    try:
        find_etcd()
    except RuntimeError as exc:
        return str(exc)
    return None


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
    etcd: bool = False,
    etcd_members: int = DEFAULT_ETCD_MEMBERS,
) -> list[Cell]:
    cells: list[Cell] = []
    for run in range(runs):
        for c in concurrency:
            plan = [(p, None) for p in partitions] + ([(0, "zk")] if zookeeper else [])
            plan += [(0, "etcd")] if etcd else []
            for p, kind in plan:
                if kind == "zk":
                    cell = measure_zookeeper(
                        os.path.join(data_dir, "zk"), c, size, seconds, zookeeper_members
                    )
                elif kind == "etcd":
                    cell = measure_etcd(
                        os.path.join(data_dir, "etcd"), c, size, seconds, etcd_members
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
    partition, and waltz with one partition against each peer (ZooKeeper, etcd) and,
    with both, against the best peer (the faster one's median rate); of the median cells,
    and with several runs, of each run's own cells too (each run's best peer is the
    faster in that run). A run measures the systems minutes apart at most, so its ratio
    is spared the machine's drift between runs, which the spread of the runs' ratios
    shows."""
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
            top, bottom = (one, s) if is_peer(s) else (s, one)
            line = f"C={c}: {top} / {bottom} = {_ratio(at_c, top, bottom):.2f}x"
            if len(runs) > 1:
                each = [_ratio([x for x in at_c if x.run == r], top, bottom) for r in runs]
                line += _each_run(each)
            lines.append(line)
        peers = [s for s in systems if is_peer(s)]
        if len(peers) > 1:
            best = max(peers, key=lambda s: median_cell([x for x in at_c if x.system == s]).rate)
            line = f"C={c}: {one} / best peer ({best}) = {_ratio(at_c, one, best):.2f}x"
            if len(runs) > 1:
                line += _each_run([_best_peer_ratio(at_c, one, peers, r) for r in runs])
            lines.append(line)
    return lines


def _each_run(each: list[float]) -> str:
    known = [f"{r:.2f}x" for r in each if not math.isnan(r)]  # a run lacks a cell
    return f" (each run: {', '.join(known)})"


def _best_peer_ratio(cells: list[Cell], one: str, peers: list[str], run: int) -> float:
    """``one``'s rate over the faster peer's in ``run``; NaN if that run lacks ``one``
    or every peer."""
    mine = [x for x in cells if x.run == run]
    ones = [x.rate for x in mine if x.system == one]
    best = [x.rate for x in mine if x.system in peers]
    if not ones or not best:
        return float("nan")
    return ones[0] / max(best)


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
        or args.etcd_members < 1
    ):
        print(
            "waltz bench: error: concurrency, partitions, --runs, --zookeeper-members and "
            "--etcd-members must be at least 1, --seconds above 0"
        )
        return 2
    print(
        f"waltz bench --compare: closed loop, {args.size}-byte writes, {args.seconds:g} s a "
        f"cell, {args.runs} run(s), a fresh cluster each; {os.cpu_count()} CPUs "
        f"({platform.machine()}), fsync on, per-record loops {describe_loops()}, waltz's "
        f"load on {event_loop.describe()}",
        flush=True,
    )
    etcd = not args.no_etcd
    missing = etcd_missing() if etcd else None
    if missing:
        print(f"no etcd column: {missing}", flush=True)
        etcd = False
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
        etcd,
        args.etcd_members,
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
