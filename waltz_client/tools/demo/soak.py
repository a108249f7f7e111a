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
import json
import sys
from typing import Any

from waltz_client.runtime.settings import parse_size
from waltz_client.tools.local.cli import add_security_flags

from .soak_report import report
from .soak_run import run_soak
from .soak_verdict import load_verdict, verdict


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


def cmd_soak(args: argparse.Namespace) -> int:
    problem = _check(args)
    if problem:
        print(f"waltz soak: error: {problem}")
        return 2
    to_stdout = args.json == "-"
    out = sys.stderr if to_stdout else sys.stdout
    duration = args.minutes * 60
    _fill_in_defaults(args, duration)

    def say(message: str) -> None:
        print(f"[waltz soak] {message}", file=out, flush=True)

    doc = run_soak(args, duration, out, say)
    ok = _judge(args, doc, duration)
    report(args, doc, duration, out)
    if args.json is not None:
        _write_json(doc, args.json)
    return 0 if ok else 1


def _fill_in_defaults(args: argparse.Namespace, duration: float) -> None:
    """The defaults that depend on other flags: the sampling interval on the run's
    length, the slow consumers' rate on the load's."""
    if args.sample_every is None:
        args.sample_every = min(30.0, max(1.0, duration / 20))
    if args.consumer_rate is None:
        args.consumer_rate = args.rate / 4


def _judge(args: argparse.Namespace, doc: dict[str, Any], duration: float) -> bool:
    """The verdict on each process and on the load, recorded in ``doc``: PASS or FAIL."""
    results = verdict(
        doc["samples"],
        doc["processes"],
        duration,
        warm_up=args.warm_up,
        max_growth_mb=args.max_growth_mb,
        max_growth_pct=args.max_growth_pct,
    )
    load = load_verdict(doc["samples"], duration, args.warm_up, args.rate)
    ok = all(r["pass"] for r in results) and load["pass"]
    doc["verdict"] = {"processes": results, "load": load, "pass": ok}
    return ok


def _write_json(doc: dict[str, Any], path: str) -> None:
    """``--json``: on stdout (``-``), or into ``path``."""
    text = json.dumps(doc, indent=2)
    if path == "-":
        print(text, flush=True)
    else:
        with open(path, "w") as f:
            f.write(text + "\n")
