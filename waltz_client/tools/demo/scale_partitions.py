"""``waltz bench --scale partitions``: throughput as the partitions of one server grow.

A preset of the ``--compare`` sweep (``compare.py``), not a copy of it: the same cells
(a fresh cluster of 3 storage nodes and ONE server a cell, 2 load processes keeping C
writes of ``--size`` bytes in flight through ``WaltzClient`` for ``--seconds``, each
write to the next partition in turn, the median of ``--runs``), at C=256 for 1, 4, 16,
64 and 256 partitions, without the ZooKeeper column. What it adds is the table issue 43
asks for: each cell's writes/s, p50 and p99, the cluster's CPU a write, and its ratio to
the 4-partition cell at the same C (the goal: 64 partitions at least 0.8x of 4).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .compare import WALTZ_SYSTEMS, Cell, cpu_table, median_cell, sweep
from .scale_settings import record

if TYPE_CHECKING:
    from .scale_settings import ScaleSettings

REFERENCE = 4  # the cell every other is compared with, when it was measured


def system_of(partitions: int) -> str:
    """The sweep's name of a waltz cell (``compare.measure_waltz``)."""
    return WALTZ_SYSTEMS[0] if partitions == 1 else f"waltz, {partitions} partitions"


def reference_of(partitions: tuple[int, ...] | list[int]) -> int:
    """4 partitions when measured, else the fewest."""
    return REFERENCE if REFERENCE in partitions else min(partitions)


def ratio(cells: list[Cell], partitions: int, reference: int, concurrency: int) -> float:
    """The median rate of ``partitions`` over that of ``reference`` at ``concurrency``
    among ``cells``; NaN when either has none."""
    mine = [c for c in cells if c.system == system_of(partitions) and c.concurrency == concurrency]
    ref = [c for c in cells if c.system == system_of(reference) and c.concurrency == concurrency]
    if not mine or not ref:
        return float("nan")
    return median_cell(mine).rate / median_cell(ref).rate


def table(cells: list[Cell], partitions: list[int], concurrency: list[int]) -> str:
    reference = reference_of(partitions)
    head = [
        "partitions", "C", "writes/s", "p50 ms", "p99 ms", "cluster CPU ms/write",
        f"/ {reference} partition{'s' if reference > 1 else ''}",
    ]  # fmt: skip
    rows = [head, ["---:"] * len(head)]
    for c in concurrency:
        for p in partitions:
            mine = [x for x in cells if x.system == system_of(p) and x.concurrency == c]
            if not mine:
                continue
            cell = median_cell(mine)
            rows.append(
                [
                    str(p),
                    str(c),
                    f"{cell.rate:,.0f}",
                    f"{cell.percentile(0.5):.2f}",
                    f"{cell.percentile(0.99):.2f}",
                    f"{cell.cpu_ms_per_write:.3f}",
                    f"{ratio(cells, p, reference, c):.2f}x",
                ]
            )
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


def run_ratios(cells: list[Cell], partitions: list[int], concurrency: list[int]) -> list[str]:
    """With several runs, each run's own ratio to the reference (cells of one run are
    measured minutes apart, spared the machine's drift between runs)."""
    runs = sorted({c.run for c in cells})
    if len(runs) < 2:
        return []
    reference = reference_of(partitions)
    lines = []
    for c in concurrency:
        for p in partitions:
            if p == reference:
                continue
            each = [ratio([x for x in cells if x.run == r], p, reference, c) for r in runs]
            known = [f"{x:.2f}x" for x in each if not math.isnan(x)]
            lines.append(
                f"C={c}: {p} / {reference} partitions = {ratio(cells, p, reference, c):.2f}x "
                f"(each run: {', '.join(known)})"
            )
    return lines


def run(s: ScaleSettings, say: Callable[[str], None]) -> list[dict[str, Any]]:
    partitions, concurrency = list(s.partitions), list(s.concurrency)
    say(
        f"the --compare sweep's cells (1 server, plain text, {s.size}-byte writes, "
        f"{s.seconds:g} s a cell, {s.runs} run(s), no ZooKeeper column) for "
        f"{','.join(map(str, partitions))} partitions at C={','.join(map(str, concurrency))}"
    )
    cells = sweep(
        s.data_dir, partitions, concurrency, s.size, s.seconds, s.runs, zookeeper=False, say=say
    )
    say("")
    say(f"median of {s.runs} run(s); issue 43's goal: 64 partitions at least 0.8x of 4")
    say(table(cells, partitions, concurrency))
    for line in run_ratios(cells, partitions, concurrency):
        say(line)
    say("")
    say(cpu_table(cells, concurrency))
    count = {system_of(p): p for p in partitions}
    return [
        record(
            c,
            partitions=count[c.system],
            latencies_ms=None,
            rate=c.rate,
            p50_ms=c.percentile(0.5),
            p99_ms=c.percentile(0.99),
            cpu_ms_per_write=c.cpu_ms_per_write,
        )
        for c in cells
    ]
