"""What ``waltz soak`` prints: Markdown tables of fixed column widths, a row at a time
(``Table``: the run prints its samples as they come), and at the end of the run the
machine and the commits, the partitions, retention over time, the consumers and the
verdict on each process (``report``).
"""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from .soak_sampling import MB
from .soak_verdict import median_before


def fmt_elapsed(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 60}:{s % 60:02d}"


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


def report(args: argparse.Namespace, doc: dict[str, Any], duration: float, out: TextIO) -> None:
    """The end of a run (``doc``, with its verdict): what ran and what it committed, the
    partitions, retention over time, the consumers, then the verdict."""
    samples = doc["samples"]
    last = samples[-1]
    _summary(args, doc, duration, out)
    _partitions_at_the_end(last, out)
    _retention_over_time(samples, last, out)
    _consumers_at_the_end(last, out)
    _verdict(args, doc, duration, out)


def _summary(args: argparse.Namespace, doc: dict[str, Any], duration: float, out: TextIO) -> None:
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


def _partitions_at_the_end(last: dict[str, Any], out: TextIO) -> None:
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


def _retention_over_time(samples: list[dict], last: dict[str, Any], out: TextIO) -> None:
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
            [fmt_elapsed(s["elapsed"])]
            + [
                f"{'-' if p['log_start'] is None else p['log_start']} / "
                f"{max(p['disk_bytes']) / MB:.1f}"
                for p in s["partitions"]
            ]
        )


def _consumers_at_the_end(last: dict[str, Any], out: TextIO) -> None:
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


def _verdict(args: argparse.Namespace, doc: dict[str, Any], duration: float, out: TextIO) -> None:
    """The RSS growth of each process and why one failed, the servers' caches, whether
    the load kept up, and PASS or FAIL."""
    v = doc["verdict"]
    warm_at = duration * args.warm_up
    print(file=out)
    print(
        f"Verdict: RSS growth from the end of the warm-up ({fmt_elapsed(warm_at)}) to the "
        f"end ({fmt_elapsed(duration)}), medians over the last {fmt_elapsed(duration / 10)} "
        f"before each; limit max({args.max_growth_mb:g} MB, {args.max_growth_pct:g}%)",
        file=out,
    )
    _growth_table(v["processes"], out)
    for r in v["processes"]:
        if not r["pass"]:
            print(f"FAIL  {r['process']}: {r['why']}", file=out)
    _caches(doc, warm_at, duration, out)
    load = v["load"]
    print(
        f"{'PASS' if load['pass'] else 'FAIL'}  the load kept up after the warm-up: "
        f"{load['tx_per_s']} tx/s of {load['target']:g}"
        + (f" ({load['why']})" if load["why"] else ""),
        file=out,
    )
    print("PASS" if v["pass"] else "FAIL", file=out, flush=True)


def _growth_table(results: list[dict], out: TextIO) -> None:
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
    for r in results:
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


def _caches(doc: dict[str, Any], warm_at: float, duration: float, out: TextIO) -> None:
    """What each server's caches held at the end of the warm-up and at the end, so that
    its RSS can be read against them."""
    samples = doc["samples"]
    for name in doc["processes"]:
        warm = median_before(samples, name, warm_at, duration / 10, "cache_mb")
        end = median_before(samples, name, duration, duration / 10, "cache_mb")
        if warm is not None and end is not None:
            print(
                f"      {name}'s feed and data caches (as it counts them): {warm:.1f} MB at "
                f"the end of the warm-up, {end:.1f} MB at the end",
                file=out,
            )
