"""``waltz soak``: a local cluster under steady load for a long time (30 minutes by
default), with retention on and slow consumers, and the resident memory (RSS) of every
process sampled throughout. Memory must be flat once warm.

What runs, all on this machine:

- an embedded ZooKeeper, three storage nodes (small segments, so retention deletes
  some every few seconds) and ``--servers`` servers, as separate processes;
- a retention policy for every partition (``--retention-bytes`` per replica), applied
  by the servers every ``--retention-interval`` seconds;
- a producer in this process, open loop: ``--rate`` transactions a second of
  ``--size`` bytes, spread over the partitions, whatever the latency;
- ``--live-consumers`` feed consumers that apply as fast as the feed comes (they keep
  up), and ``--slow-consumers`` that apply ``--consumer-rate`` transactions a second
  each, over all partitions: less than is written, so they fall further and further
  behind until retention deletes what they have not read yet. Slow consumers
  alternate between the two ways of reading the log: the feed (``WaltzClientCallbacks``
  with a slow apply that fetches each transaction's data: the fetch, or the mount once
  the server has ended the feed, raises ``MissingTransactions``) and range reads
  (``read_batches``, which raise it too). Either way the consumer then skips to the
  first available transaction and counts what it lost.

Every ``--sample-every`` seconds it reads ``VmRSS`` from ``/proc/<pid>/status`` of
ZooKeeper (the JVM), each storage node, each server and this process (the producer
and the consumers), the commit rate, the consumers' progress and skips, and each
partition's log start (from its metadata in ZooKeeper) and disk use (its directory on
each storage node).

The verdict: for each process, the RSS at the end of the warm-up (the first half by
default) against the RSS at the end (each the median of the samples in the last tenth
of the run before that point, so that one sample taken in a garbage collector's peak
does not decide), PASS if it grew by less than ``max(--max-growth-mb,
--max-growth-pct of the warm RSS)``: 10 MB or 10% by default.

Why half: warm means every bounded cache is full, and the slowest to fill is the
server's feed cache (16 MiB a partition by default: up to about 182,000 headers, kept
as Python bytes objects of about 70 bytes each, 13 MB). At the default 250 transactions
a second per partition it is full after about 12 minutes; the first third of a 30-minute
run would end before that. The per-sample table shows the server's caches as it counts
them (``server caches MB``), so a run can be read against them.

Why 10 MB or 10%: once the caches are full a healthy process only moves by allocator and
garbage-collector noise, a few MB; a leak grows with the traffic, and 10 MB over the 15
minutes after a default warm-up is 11 bytes per transaction at 1,000 a second: about one
offset-index entry (8 bytes), the smallest thing the log keeps per record. A shorter run
catches only larger leaks. A run also fails if a process died or the cluster did not
commit at least 80% of the target rate after the warm-up (a stalled cluster is trivially
flat). Exit 0 on PASS, 1 on FAIL.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import platform
import shutil
import statistics
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from waltz_client.callbacks import WaltzClientCallbacks
from waltz_client.client import MissingTransactions, SubmitStatus, WaltzClient, WaltzError
from waltz_client.cluster import admin
from waltz_client.cluster.retention import RetentionRule
from waltz_client.cluster.zk import close
from waltz_client.config import WaltzClientConfig
from waltz_client.runtime import event_loop
from waltz_client.runtime.settings import parse_size
from waltz_client.tools.local.cli import add_security_flags
from waltz_client.tools.local.cluster import HOST, LocalCluster
from waltz_client.tools.local.processes import DaemonProcess
from waltz_client.transaction import Transaction

from .common import Put, open_loop

MB = 1_000_000
LOAD = "load"  # this process: the producer and the consumers


def register(groups: argparse._SubParsersAction) -> None:
    p = groups.add_parser(
        "soak",
        help="a long run under load with retention and slow consumers: RSS of every process",
    )
    p.add_argument("--data-dir", default=".waltz-local/soak", help="wiped and reused")
    p.add_argument("--minutes", type=float, default=30.0, help="of load (default 30)")
    p.add_argument("--partitions", type=int, default=4, help="partitions (default 4)")
    p.add_argument("--servers", type=int, default=1, help="servers (default 1)")
    p.add_argument("--rate", type=float, default=1000.0, help="tx/s written (default 1000)")
    p.add_argument("--size", type=int, default=1024, help="bytes a transaction (default 1024)")
    p.add_argument(
        "--retention-bytes",
        default="8MiB",
        help="retention: bytes kept per partition per replica (default 8MiB)",
    )
    p.add_argument("--segment-bytes", default="2MiB", help="storage segment size (default 2MiB)")
    p.add_argument(
        "--retention-interval",
        type=float,
        default=5.0,
        help="seconds between a server's retention steps (default 5)",
    )
    p.add_argument(
        "--slow-consumers",
        type=int,
        default=2,
        help="consumers slower than the load, alternately feed and range reads (default 2)",
    )
    p.add_argument(
        "--consumer-rate",
        type=float,
        default=None,
        help="tx/s each slow consumer applies (default a quarter of --rate)",
    )
    p.add_argument(
        "--live-consumers", type=int, default=1, help="feed consumers keeping up (default 1)"
    )
    p.add_argument(
        "--sample-every",
        type=float,
        default=None,
        help="seconds between samples (default a twentieth of the run, 1 to 30)",
    )
    p.add_argument(
        "--warm-up",
        type=float,
        default=0.5,
        help="fraction of the run that is warm-up (default 0.5: the server's feed caches "
        "take about 12 minutes to fill at the default rate)",
    )
    p.add_argument(
        "--max-growth-mb", type=float, default=10.0, help="RSS growth allowed (default 10)"
    )
    p.add_argument(
        "--max-growth-pct",
        type=float,
        default=10.0,
        help="... or this percentage of the warm RSS, if more (default 10)",
    )
    p.add_argument(
        "--storage-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="passed to every storage node (repeat; e.g. --storage-arg=--max-frame-bytes=8MiB)",
    )
    p.add_argument(
        "--server-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="passed to every server (repeat; e.g. --server-arg=--feed-cache-bytes=4MiB)",
    )
    add_security_flags(p)  # mutual TLS and ZooKeeper ACLs unless --insecure
    p.add_argument(
        "--json",
        nargs="?",
        const="-",
        default=None,
        metavar="PATH",
        help="machine-readable results: alone, on stdout (the table goes to stderr); "
        "with a PATH, into that file besides the table",
    )
    p.set_defaults(func=cmd_soak)


# --- the workload -----------------------------------------------------------------------


class _Pacer:
    """At most ``rate`` a second on average (0: no limit), with at most a second of
    credit: a consumer held up (a refused mount) does not then race to catch up."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.due = 0.0

    async def take(self, n: int) -> None:
        if self.rate <= 0:
            return
        now = time.monotonic()
        self.due = max(self.due, now - 1.0) + n / self.rate
        if self.due - now > 0.002:
            await asyncio.sleep(self.due - now)


@dataclass
class Consumer:
    """One consumer's progress: ``applied[p]`` is the last transaction it consumed of
    partition ``p``."""

    name: str
    kind: str  # "feed" or "range"
    rate: float  # 0: as fast as it comes
    partitions: int
    consumed: int = 0
    data_bytes: int = 0  # transaction data read (slow consumers)
    skips: int = 0  # times it fell below the log start
    skipped: int = 0  # transactions it never saw because of that
    errors: int = 0  # reads that failed otherwise (retried)
    applied: dict[int, int] = field(default_factory=dict)

    def behind(self, hwms: dict[int, int]) -> int:
        return sum(max(0, h - self.applied.get(p, -1)) for p, h in hwms.items())

    def skip(self, p: int, first_available: int) -> None:
        gone = first_available - 1 - self.applied.get(p, -1)
        if gone > 0:
            self.skips += 1
            self.skipped += gone
            self.applied[p] = first_available - 1


class _FeedCallbacks(WaltzClientCallbacks):
    """A feed consumer: counts each transaction, paced. A slow one also fetches each
    transaction's data, as an application that needs it does: the feed may have
    delivered headers (buffered in this client) of transactions that retention has
    since deleted, and the fetch is what finds out. It then raises, the client mounts
    again, and ``skip_to`` is where the new mount starts (``_watch_feed`` sets it too,
    for a mount refused outright)."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self.pacer = _Pacer(consumer.rate)
        self.fetch = consumer.rate > 0
        self.skip_to: dict[int, int] = {}

    async def client_high_water_mark(self, partition_id: int) -> int:
        c = self.consumer
        first_available = self.skip_to.pop(partition_id, None)
        if first_available is not None:
            c.skip(partition_id, first_available)
        return c.applied.get(partition_id, -1)

    async def apply_transaction(self, transaction: Transaction) -> None:
        c = self.consumer
        if self.fetch:
            try:
                c.data_bytes += len(await transaction.data())
            except MissingTransactions as e:
                self.skip_to[transaction.partition_id] = e.first_available
                raise
        c.applied[transaction.partition_id] = transaction.transaction_id
        c.consumed += 1
        await self.pacer.take(1)

    def uncaught_exception(self, partition_id: int, transaction_id: int, error: BaseException):
        if isinstance(error, MissingTransactions):
            return  # expected of a slow consumer, and counted
        self.consumer.errors += 1
        super().uncaught_exception(partition_id, transaction_id, error)


async def _first_batch(client: WaltzClient, p: int, start: int, records: int):
    """The first batch of a range read from ``start`` (None at the end of the log)."""
    batches = client.read_batches(p, start, batch_records=records)
    try:
        return await anext(batches, None)
    finally:
        await batches.aclose()


async def _watch_feed(client: WaltzClient, callbacks: _FeedCallbacks, stop: asyncio.Event):
    """A feed consumer whose partition made no progress for a while may be below the log
    start (its mount refused): a one-record range read says so, and where the log starts
    now; its next mount starts there."""
    c = callbacks.consumer
    last: dict[int, int] = {}
    while not stop.is_set():
        await asyncio.sleep(2.0)
        for p in range(c.partitions):
            applied = c.applied.get(p, -1)
            if last.get(p) == applied:
                try:
                    await _first_batch(client, p, applied + 1, 1)
                except MissingTransactions as e:
                    callbacks.skip_to[p] = e.first_available
                except WaltzError:
                    pass
            last[p] = applied


async def _range_reader(client: WaltzClient, c: Consumer, stop: asyncio.Event) -> None:
    """Range reads over every partition in turn, a batch at a time, paced; records are
    decoded and their data touched, as an application would."""
    pacer = _Pacer(c.rate)
    while not stop.is_set():
        progressed = False
        for p in range(c.partitions):
            start = c.applied.get(p, -1) + 1
            try:
                batch = await _first_batch(client, p, start, 100)
            except MissingTransactions as e:
                c.skip(p, e.first_available)
                continue
            except WaltzError:
                c.errors += 1
                await asyncio.sleep(1.0)
                continue
            if batch is None:
                continue
            n = 0
            for record in batch.records():
                n += 1
                c.data_bytes += len(record.data)
            c.applied[p] = batch.last_txid
            c.consumed += n
            progressed = True
            await pacer.take(n)
            if stop.is_set():
                return
        if not progressed:
            await asyncio.sleep(0.2)


class _BelowLogStart(logging.Filter):
    """The client logs a refused mount below the log start as an error; here that is
    expected (slow consumers), and counted instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "below the log start" not in record.getMessage()


# --- sampling ---------------------------------------------------------------------------


def rss_bytes(pid: int | None) -> int | None:
    """VmRSS of ``pid`` (None: not running)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def cluster_processes(cluster: LocalCluster) -> list[tuple[str, Callable[[], int | None]]]:
    """(name, its pid now) of every process of the run; ``load`` is this one."""
    procs: list[tuple[str, Callable[[], int | None]]] = []
    zk = cluster.zookeeper
    if zk is not None:
        procs.append(("zookeeper", lambda: zk.pid))
    for d in [*cluster.storages, *cluster.servers]:
        procs.append((d.name, lambda d=d: d.pid if d.running else None))
    procs.append((LOAD, os.getpid))
    return procs


def partition_disk(cluster: LocalCluster, p: int) -> tuple[list[int], list[int]]:
    """(bytes, segment files) of partition ``p`` on each storage node."""
    sizes, segments = [], []
    for i in range(len(cluster.storages)):
        total = count = 0
        try:
            with os.scandir(os.path.join(cluster.data_dir, f"storage-{i}", str(p))) as it:
                for entry in it:
                    try:
                        total += entry.stat().st_size
                    except OSError:  # deleted by retention as we looked
                        continue
                    count += entry.name.endswith(".seg")
        except OSError:
            pass
        sizes.append(total)
        segments.append(count)
    return sizes, segments


def server_cache_bytes(server: DaemonProcess) -> int | None:
    """What the server's feed and data caches hold now, as it counts them (its
    ``waltz_server_memory_cache_bytes`` metric; None if it does not answer on plain
    HTTP)."""
    port = server.ready.get("http_port") if server.running else None
    if not port:
        return None
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("waltz_server_memory_cache_bytes "):
                    return int(float(line.split()[1]))
    except (OSError, ValueError):
        return None
    return None


@dataclass
class Load:
    committed: int = 0
    failed: int = 0


def _fmt_elapsed(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 60}:{s % 60:02d}"


def _mb(n: int | None) -> float | None:
    return None if n is None else round(n / MB, 1)


class Table:
    """Rows printed as they come, in a Markdown table of fixed column widths."""

    def __init__(self, out: TextIO, headers: list[str], widths: list[int] | None = None):
        self.out = out
        self.widths = widths or [max(8, len(h)) for h in headers]
        self.row(headers)
        self.out.write("|" + "|".join(" " + "-" * (w - 1) + ": " for w in self.widths) + "|\n")

    def row(self, cells: list[Any]) -> None:
        text = [
            "-" if c is None else f"{c:,.1f}" if isinstance(c, float) else str(c) for c in cells
        ]
        self.out.write(
            "| " + " | ".join(t.rjust(w) for t, w in zip(text, self.widths, strict=True)) + " |\n"
        )
        self.out.flush()


# --- the verdict ------------------------------------------------------------------------


def _median_before(
    samples: list[dict], name: str, until: float, window: float, key: str = "rss_mb"
) -> float | None:
    """Median RSS (MB; or another ``key``) of ``name`` over the samples in ``[until -
    window, until]`` (at least the latest sample at or before ``until``)."""
    before = [s for s in samples if s["elapsed"] <= until + 1e-6]
    picked = [s for s in before if s["elapsed"] >= until - window] or before[-1:]
    values = [s[key][name] for s in picked if s.get(key, {}).get(name) is not None]
    return statistics.median(values) if values else None


def _slope_mb_per_hour(samples: list[dict], name: str, since: float) -> float | None:
    points = [
        (s["elapsed"], s["rss_mb"][name])
        for s in samples
        if s["elapsed"] >= since and s["rss_mb"].get(name) is not None
    ]
    if len(points) < 2:
        return None
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    var = sum((x - mx) ** 2 for x, _ in points)
    if var == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in points) / var * 3600


def verdict(
    samples: list[dict],
    names: list[str],
    duration: float,
    *,
    warm_up: float = 0.5,
    max_growth_mb: float = 10.0,
    max_growth_pct: float = 10.0,
) -> list[dict]:
    """Per process: RSS at the end of the warm-up and at the end, growth, PASS/FAIL.
    Samples: ``{"elapsed": s, "rss_mb": {name: MB or None}}`` in time order."""
    warm_at = duration * warm_up
    window = duration / 10
    results = []
    for name in names:
        warm = _median_before(samples, name, warm_at, window)
        end = _median_before(samples, name, duration, window)
        alive = bool(samples) and samples[-1]["rss_mb"].get(name) is not None
        if warm is None or end is None or not alive:
            results.append(
                {
                    "process": name,
                    "warm_mb": warm,
                    "end_mb": end,
                    "growth_mb": None,
                    "growth_pct": None,
                    "slope_mb_per_h": None,
                    "limit_mb": None,
                    "pass": False,
                    "why": "not running at the end" if not alive else "no samples",
                }
            )
            continue
        growth = end - warm
        limit = max(max_growth_mb, warm * max_growth_pct / 100)
        slope = _slope_mb_per_hour(samples, name, warm_at)
        results.append(
            {
                "process": name,
                "warm_mb": round(warm, 1),
                "end_mb": round(end, 1),
                "growth_mb": round(growth, 1),
                "growth_pct": round(100 * growth / warm, 1) if warm else None,
                "slope_mb_per_h": None if slope is None else round(slope, 1),
                "limit_mb": round(limit, 1),
                "pass": growth < limit,
                "why": None if growth < limit else f"grew {growth:.1f} MB (limit {limit:.1f})",
            }
        )
    return results


def load_verdict(samples: list[dict], duration: float, warm_up: float, rate: float) -> dict:
    """Did the cluster keep committing after the warm-up (at least 80% of the target)?"""
    warm_at = duration * warm_up
    after = [s for s in samples if s["elapsed"] >= warm_at - 1e-6]
    if len(after) < 2:
        return {"tx_per_s": None, "target": rate, "pass": False, "why": "too few samples"}
    span = after[-1]["elapsed"] - after[0]["elapsed"]
    committed = after[-1]["committed"] - after[0]["committed"]
    achieved = committed / span if span > 0 else 0.0
    ok = achieved >= 0.8 * rate
    return {
        "tx_per_s": round(achieved, 1),
        "target": rate,
        "pass": ok,
        "why": None if ok else f"{achieved:.0f} tx/s after the warm-up, under 80% of {rate:g}",
    }


# --- the run ----------------------------------------------------------------------------


def _check(args: argparse.Namespace) -> str | None:
    if args.minutes <= 0 or args.rate <= 0:
        return "--minutes and --rate must be positive"
    if args.partitions < 1 or args.servers < 1:
        return "--partitions and --servers must be at least 1"
    if args.size < 0 or args.slow_consumers < 0 or args.live_consumers < 0:
        return "--size, --slow-consumers and --live-consumers must not be negative"
    if args.consumer_rate is not None and args.consumer_rate <= 0:
        return "--consumer-rate must be positive"
    if args.sample_every is not None and args.sample_every <= 0:
        return "--sample-every must be positive"
    if not 0 < args.warm_up < 1:
        return "--warm-up must be a fraction between 0 and 1"
    try:
        args.retention_bytes = parse_size(args.retention_bytes)
        args.segment_bytes = parse_size(args.segment_bytes)
    except ValueError as e:
        return str(e)
    if args.retention_bytes < 1 or args.segment_bytes < 4096:
        return "--retention-bytes must be positive and --segment-bytes at least 4096"
    if not 0.1 <= args.retention_interval <= 86400:
        return "--retention-interval must be 0.1 to 86400 seconds"
    return None


def machine() -> dict:
    mem = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem = round(int(line.split()[1]) / 1024**2, 1)
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "arch": platform.machine(),
        "memory_gib": mem,
        "python": platform.python_version(),
    }


def cmd_soak(args: argparse.Namespace) -> int:
    problem = _check(args)
    if problem:
        print(f"waltz soak: error: {problem}")
        return 2
    to_stdout = args.json == "-"
    out = sys.stderr if to_stdout else sys.stdout
    duration = args.minutes * 60
    if args.sample_every is None:
        args.sample_every = min(30.0, max(1.0, duration / 20))
    if args.consumer_rate is None:
        args.consumer_rate = args.rate / 4

    def say(message: str) -> None:
        print(f"[waltz soak] {message}", file=out, flush=True)

    shutil.rmtree(args.data_dir, ignore_errors=True)
    cluster = LocalCluster(
        args.data_dir,
        storages=3,
        partitions=args.partitions,
        replicas=3,
        servers=args.servers,
        storage_args=["--segment-bytes", str(args.segment_bytes), *args.storage_arg],
        server_args=[
            "--retention-interval",
            str(args.retention_interval),
            *args.server_arg,
        ],
        tls=not args.insecure,
    )
    say(
        f"starting a local cluster in {cluster.data_dir}: ZooKeeper, 3 storage nodes "
        f"({args.segment_bytes / 2**20:g} MiB segments), {args.servers} server(s), "
        f"{args.partitions} partitions x 3 replicas, "
        + ("plain text" if args.insecure else "mutual TLS")
    )
    cluster.start()
    logging.getLogger("waltz_client.client").addFilter(_BelowLogStart())
    try:
        zk = cluster.zk_connect()
        try:
            admin.update_retention(
                zk,
                cluster.layout.root,
                lambda policy: policy.with_rule(
                    [None], RetentionRule(max_bytes=args.retention_bytes)
                ),
            )
            say(
                f"retention: keep {args.retention_bytes / 2**20:g} MiB per partition per "
                f"replica, applied every {args.retention_interval:g} s"
            )
            doc = event_loop.run(_soak(args, cluster, zk, duration, out, say))
        finally:
            close(zk)
    finally:
        cluster.stop()

    names = doc["processes"]
    results = verdict(
        doc["samples"],
        names,
        duration,
        warm_up=args.warm_up,
        max_growth_mb=args.max_growth_mb,
        max_growth_pct=args.max_growth_pct,
    )
    load = load_verdict(doc["samples"], duration, args.warm_up, args.rate)
    ok = all(r["pass"] for r in results) and load["pass"]
    doc["verdict"] = {"processes": results, "load": load, "pass": ok}
    _report(args, doc, duration, out)
    if args.json is not None:
        text = json.dumps(doc, indent=2)
        if to_stdout:
            print(text, flush=True)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    return 0 if ok else 1


async def _soak(args, cluster: LocalCluster, zk, duration: float, out, say) -> dict:
    def config(feed: bool) -> WaltzClientConfig:
        return WaltzClientConfig(
            cluster.zookeeper_connect,
            zk_root=cluster.layout.root,
            feed=feed,
            max_retries=1000,
            tls=cluster.client_tls,
            zk_tls=cluster.client_zk_tls,
        )

    consumers: list[Consumer] = []
    clients: list[WaltzClient] = []
    tasks: list[asyncio.Task] = []
    stop = asyncio.Event()
    producer = await WaltzClient(config(False)).start()
    clients.append(producer)
    for i in range(args.live_consumers):
        consumers.append(Consumer(f"live-{i}", "feed", 0.0, args.partitions))
    for i in range(args.slow_consumers):
        kind = "feed" if i % 2 == 0 else "range"
        consumers.append(Consumer(f"slow-{i}", kind, args.consumer_rate, args.partitions))
    for c in consumers:
        if c.kind == "feed":
            callbacks = _FeedCallbacks(c)
            client = await WaltzClient(config(True), callbacks).start()
            tasks.append(asyncio.create_task(_watch_feed(client, callbacks, stop)))
        else:
            client = await WaltzClient(config(False)).start()
            tasks.append(asyncio.create_task(_range_reader(client, c, stop)))
        clients.append(client)

    load = Load()
    payload = os.urandom(args.size)

    async def one(i: int) -> None:
        try:
            r = await producer.submit(Put(i % args.partitions, payload))
        except WaltzError:
            load.failed += 1
            return
        if r.status == SubmitStatus.COMMITTED:
            load.committed += 1
        else:
            load.failed += 1

    procs = cluster_processes(cluster)
    names = [n for n, _ in procs]
    slow = [c for c in consumers if c.rate > 0]
    live = [c for c in consumers if c.rate <= 0]
    say(
        f"load: {args.rate:g} tx/s of {args.size} bytes for {args.minutes:g} min "
        f"({_fmt_elapsed(duration)}); {len(slow)} slow consumer(s) at "
        f"{args.consumer_rate:g} tx/s each "
        f"({', '.join(c.kind for c in slow) or 'none'}), {len(live)} live; "
        f"RSS sampled every {args.sample_every:g} s; warm-up "
        f"{_fmt_elapsed(duration * args.warm_up)}"
    )
    print(file=out)
    print("RSS (MB) of every process over time, and the load", file=out)
    table = Table(
        out,
        [
            "elapsed",
            *names,
            "commits tx/s",
            "live behind",
            "slow behind",
            "slow skipped",
            "log start (min)",
            "disk MB",
            "server caches MB",
        ],
    )
    samples: list[dict] = []

    async def sample(elapsed: float) -> None:
        rss = {n: _mb(rss_bytes(pid())) for n, pid in procs}
        hwms: dict[int, int] = {}
        for p in range(args.partitions):
            with contextlib.suppress(WaltzError, TimeoutError):
                hwms[p] = await asyncio.wait_for(producer.high_water_mark(p), 10)

        def blocking():
            try:
                state = admin.read_cluster(zk, cluster.layout.root)
                starts = {p: m.log_start for p, m in state.partitions.items()}
            except Exception:
                starts = {}
            disk = {p: partition_disk(cluster, p) for p in range(args.partitions)}
            caches = {d.name: _mb(server_cache_bytes(d)) for d in cluster.servers}
            return starts, disk, caches

        starts, disk, caches = await asyncio.to_thread(blocking)
        previous = samples[-1] if samples else None
        span = elapsed - previous["elapsed"] if previous else 0
        rate = (load.committed - previous["committed"]) / span if previous and span else None
        s = {
            "elapsed": round(elapsed, 1),
            "rss_mb": rss,
            "cache_mb": caches,
            "committed": load.committed,
            "failed": load.failed,
            "tx_per_s": None if rate is None else round(rate, 1),
            "partitions": [
                {
                    "partition": p,
                    "high_water_mark": hwms.get(p),
                    "log_start": starts.get(p),
                    "disk_bytes": disk[p][0],
                    "segments": disk[p][1],
                }
                for p in range(args.partitions)
            ],
            "consumers": [
                {
                    "name": c.name,
                    "kind": c.kind,
                    "rate": c.rate,
                    "consumed": c.consumed,
                    "data_bytes": c.data_bytes,
                    "behind": c.behind(hwms),
                    "skips": c.skips,
                    "skipped": c.skipped,
                    "errors": c.errors,
                }
                for c in consumers
            ],
        }
        samples.append(s)
        table.row(
            [
                _fmt_elapsed(elapsed),
                *[rss[n] for n in names],
                None if rate is None else round(rate),
                sum(c.behind(hwms) for c in live) if live else None,
                sum(c.behind(hwms) for c in slow) if slow else None,
                sum(c.skipped for c in slow) if slow else None,
                min(starts.values()) if starts else None,
                round(sum(sum(d[0]) for d in disk.values()) / MB, 1),
                None if None in caches.values() else round(sum(caches.values()), 1),
            ]
        )

    started = time.monotonic()
    producing = asyncio.create_task(open_loop(args.rate, max(1, int(args.rate * duration)), one))
    try:
        await sample(0.0)
        k = 1
        while True:
            at = min(duration, k * args.sample_every)
            await asyncio.sleep(max(0.0, started + at - time.monotonic()))
            await sample(time.monotonic() - started)
            if at >= duration:
                break
            k += 1
    finally:
        stop.set()
        try:
            await asyncio.wait_for(producing, 30)
        except TimeoutError:
            say("the producer's last submissions did not finish within 30 s")
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for c in clients:
            await c.close()
    return {
        "settings": {
            "minutes": args.minutes,
            "partitions": args.partitions,
            "servers": args.servers,
            "rate": args.rate,
            "size": args.size,
            "retention_bytes": args.retention_bytes,
            "segment_bytes": args.segment_bytes,
            "retention_interval": args.retention_interval,
            "slow_consumers": args.slow_consumers,
            "consumer_rate": args.consumer_rate,
            "live_consumers": args.live_consumers,
            "sample_every": args.sample_every,
            "warm_up": args.warm_up,
            "max_growth_mb": args.max_growth_mb,
            "max_growth_pct": args.max_growth_pct,
            "storage_args": args.storage_arg,
            "server_args": args.server_arg,
            "tls": not args.insecure,
        },
        "machine": machine(),
        "processes": names,
        "pids": {n: pid() for n, pid in procs},
        "samples": samples,
        "final": {"committed": load.committed, "failed": load.failed},
    }


def _report(args, doc: dict, duration: float, out: TextIO) -> None:
    samples = doc["samples"]
    last = samples[-1]
    m = doc["machine"]
    print(file=out)
    print(
        f"machine: {m['cpus']} CPUs ({m['arch']}), {m['memory_gib']} GiB, Python {m['python']}",
        file=out,
    )
    print(
        f"committed {doc['final']['committed']:,} transactions "
        f"({doc['final']['committed'] / duration:,.0f} tx/s over the run, target "
        f"{args.rate:g}), {doc['final']['failed']} failed",
        file=out,
    )
    print(file=out)
    print("Partitions at the end", file=out)
    t = Table(
        out,
        ["partition", "high-water mark", "log start", "kept tx", "disk MB per replica", "segments"],
    )
    for p in last["partitions"]:
        hwm, start = p["high_water_mark"], p["log_start"]
        t.row(
            [
                p["partition"],
                hwm,
                start,
                None if hwm is None or start is None else hwm - start + 1,
                " / ".join(f"{b / MB:.1f}" for b in p["disk_bytes"]),
                " / ".join(str(n) for n in p["segments"]),
            ]
        )
    print(file=out)
    print(
        "Retention over time: each partition's log start, and disk MB (largest replica)", file=out
    )
    t = Table(
        out,
        ["elapsed", *[f"partition {p['partition']}" for p in last["partitions"]]],
        [8] + [20] * len(last["partitions"]),
    )
    for s in samples:
        t.row(
            [_fmt_elapsed(s["elapsed"])]
            + [
                f"{'-' if p['log_start'] is None else p['log_start']} / "
                f"{max(p['disk_bytes']) / MB:.1f}"
                for p in s["partitions"]
            ]
        )
    print(file=out)
    print("Consumers at the end", file=out)
    t = Table(
        out,
        [
            "consumer",
            "reads by",
            "tx/s",
            "consumed",
            "behind",
            "fell below log start",
            "skipped tx",
            "errors",
        ],
    )
    for c in last["consumers"]:
        t.row(
            [
                c["name"],
                c["kind"],
                f"{c['rate']:g}" if c["rate"] else "all",
                c["consumed"],
                c["behind"],
                c["skips"],
                c["skipped"],
                c["errors"],
            ]
        )
    v = doc["verdict"]
    warm_at = duration * args.warm_up
    print(file=out)
    print(
        f"Verdict: RSS growth from the end of the warm-up ({_fmt_elapsed(warm_at)}) to the "
        f"end ({_fmt_elapsed(duration)}), medians over the last {_fmt_elapsed(duration / 10)} "
        f"before each; limit max({args.max_growth_mb:g} MB, {args.max_growth_pct:g}%)",
        file=out,
    )
    t = Table(
        out,
        [
            "process",
            "warm MB",
            "end MB",
            "growth MB",
            "growth %",
            "slope MB/h",
            "limit MB",
            "verdict",
        ],
        [10, 8, 8, 9, 8, 10, 8, 7],
    )
    for r in v["processes"]:
        t.row(
            [
                r["process"],
                r["warm_mb"],
                r["end_mb"],
                r["growth_mb"],
                r["growth_pct"],
                r["slope_mb_per_h"],
                r["limit_mb"],
                "PASS" if r["pass"] else "FAIL",
            ]
        )
    for r in v["processes"]:
        if not r["pass"]:
            print(f"FAIL  {r['process']}: {r['why']}", file=out)
    for name in doc["processes"]:
        warm = _median_before(samples, name, warm_at, duration / 10, "cache_mb")
        end = _median_before(samples, name, duration, duration / 10, "cache_mb")
        if warm is not None and end is not None:
            print(
                f"      {name}'s feed and data caches (as it counts them): {warm:.1f} MB at "
                f"the end of the warm-up, {end:.1f} MB at the end",
                file=out,
            )
    load = v["load"]
    print(
        f"{'PASS' if load['pass'] else 'FAIL'}  the load kept up after the warm-up: "
        f"{load['tx_per_s']} tx/s of {load['target']:g}"
        + (f" ({load['why']})" if load["why"] else ""),
        file=out,
    )
    print("PASS" if v["pass"] else "FAIL", file=out, flush=True)
