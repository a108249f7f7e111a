"""``waltz bench --scale tls``: what mutual TLS costs a write, cell by cell.

For each partition count (1 and 4) and each concurrency C (1, 16, 256): two cells of the
``--compare`` sweep's kind (``compare.measure``: a fresh cluster of 3 storage nodes and
one server, 2 load processes, 1 at C=1, keeping C writes in flight for ``--seconds``),
one in plain text and one with every link on mutual TLS (client to server and server to
storage nodes, certificates from the local cluster's throw-away CA; ZooKeeper on its TLS
port, off the write path), measured one after the other. Both go through the same load
code here, which differs from the sweep's only in passing the cluster's client
certificate; the sweep's own load runs plain text only. Reported: writes/s, p50 and p99,
the cluster's CPU a write, and the TLS/plain ratio of each pair (the goal: at least
0.85x), the median of ``--runs``, each run's own ratio too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from waltz_client.runtime import event_loop

from .common import fresh_cluster
from .compare import Cell, LoadResult, closed_loop_writes, measure, median_cell
from .scale_settings import record

if TYPE_CHECKING:
    from multiprocessing.queues import Queue
    from multiprocessing.synchronize import Barrier

    from waltz_client.runtime.tls import TlsFiles

    from .scale_settings import ScaleSettings


def system_name(tls: bool, partitions: int) -> str:
    return (
        f"waltz {'TLS' if tls else 'plain'}, {partitions} partition{'s' if partitions > 1 else ''}"
    )


def _load(
    zookeeper: str,
    root: str,
    partitions: int,
    tls: TlsFiles | None,
    zk_tls: TlsFiles | None,
    inflight: int,
    size: int,
    ready: Barrier,
    seconds: float,
    out: Queue[LoadResult],
) -> None:
    """A load process of ``compare.measure``: ``inflight`` writes in flight through one
    WaltzClient, over TLS when ``tls`` is given, for ``seconds`` once every load
    process is ready (``compare.closed_loop_writes``)."""
    from waltz_client.config import WaltzClientConfig

    async def main() -> LoadResult:
        config = WaltzClientConfig(
            zookeeper,
            zk_root=root,
            feed=False,
            max_outstanding_appends=max(1, inflight),
            tls=tls,
            zk_tls=zk_tls,
        )
        latencies, _ = await closed_loop_writes(config, partitions, inflight, size, ready, seconds)
        return len(latencies), latencies, "WaltzClient " + ("on TLS" if tls else "plain")

    out.put(event_loop.run(main()))


def measure_cell(
    data_dir: str, partitions: int, concurrency: int, size: int, seconds: float, tls: bool
) -> Cell:
    cluster = fresh_cluster(data_dir, partitions, 1, [], tls=tls)
    cluster.start()
    try:
        roles = {
            "server": [p.pid for p in cluster.servers if p.pid is not None],
            "storage": [p.pid for p in cluster.storages if p.pid is not None],
        }
        connect = (
            cluster.zookeeper_connect,
            cluster.layout.root,
            partitions,
            cluster.client_tls,
            cluster.client_zk_tls,
        )
        system = system_name(tls, partitions)
        return measure(system, _load, connect, roles, concurrency, size, seconds)
    finally:
        cluster.stop()


def ratio(cells: list[Cell], partitions: int, concurrency: int) -> float:
    """The median TLS rate over the median plain rate of a cell; NaN lacking either."""
    sides = []
    for tls in (True, False):
        name = system_name(tls, partitions)
        sides.append([c for c in cells if c.system == name and c.concurrency == concurrency])
    if not sides[0] or not sides[1]:
        return float("nan")
    return median_cell(sides[0]).rate / median_cell(sides[1]).rate


def table(cells: list[Cell], partitions: list[int], concurrency: list[int]) -> str:
    head = [
        "partitions", "C", "plain writes/s", "TLS writes/s", "TLS / plain",
        "plain p50 / p99 ms", "TLS p50 / p99 ms", "cluster CPU ms/write plain / TLS",
    ]  # fmt: skip
    rows = [head, ["---:"] * len(head)]
    for p in partitions:
        for c in concurrency:
            pair = []
            for tls in (False, True):
                mine = [x for x in cells if x.system == system_name(tls, p) and x.concurrency == c]
                pair.append(median_cell(mine) if mine else None)
            plain, secure = pair
            if plain is None or secure is None:
                continue
            rows.append(
                [
                    str(p),
                    str(c),
                    f"{plain.rate:,.0f}",
                    f"{secure.rate:,.0f}",
                    f"{ratio(cells, p, c):.2f}x",
                    f"{plain.percentile(0.5):.2f} / {plain.percentile(0.99):.2f}",
                    f"{secure.percentile(0.5):.2f} / {secure.percentile(0.99):.2f}",
                    f"{plain.cpu_ms_per_write:.3f} / {secure.cpu_ms_per_write:.3f}",
                ]
            )
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


def run_ratios(cells: list[Cell], partitions: list[int], concurrency: list[int]) -> list[str]:
    """Each run's own TLS/plain ratio, when there are several."""
    runs = sorted({c.run for c in cells})
    if len(runs) < 2:
        return []
    lines = []
    for p in partitions:
        for c in concurrency:
            each = [ratio([x for x in cells if x.run == r], p, c) for r in runs]
            known = [f"{x:.2f}x" for x in each if not math.isnan(x)]
            lines.append(
                f"{p} partition(s), C={c}: TLS / plain = {ratio(cells, p, c):.2f}x "
                f"(each run: {', '.join(known)})"
            )
    return lines


def run(s: ScaleSettings, say: Callable[[str], None]) -> list[dict[str, Any]]:
    partitions, concurrency = list(s.partitions), list(s.concurrency)
    say(
        f"plain text and mutual TLS, one after the other, for {','.join(map(str, partitions))} "
        f"partition(s) at C={','.join(map(str, concurrency))}: 1 server, {s.size}-byte "
        f"writes, {s.seconds:g} s a cell, {s.runs} run(s)"
    )
    cells: list[Cell] = []
    for r in range(s.runs):
        for p in partitions:
            for c in concurrency:
                for tls in (False, True):
                    cell = measure_cell(s.data_dir, p, c, s.size, s.seconds, tls)
                    cell.run = r
                    cells.append(cell)
                    say(
                        f"run {r + 1}/{s.runs} {cell.system:26s} C={c:<4d} "
                        f"{cell.rate:10,.0f} writes/s  p50 {cell.percentile(0.5):7.2f} ms  "
                        f"p99 {cell.percentile(0.99):7.2f} ms  cluster CPU "
                        f"{cell.cpu_ms_per_write:.3f} ms/write ({cell.cpu_split()})"
                    )
    say("")
    say(f"median of {s.runs} run(s); issue 43's goal: TLS at least 0.85x of plain text")
    say(table(cells, partitions, concurrency))
    for line in run_ratios(cells, partitions, concurrency):
        say(line)
    kind = {system_name(t, p): (t, p) for p in partitions for t in (False, True)}
    return [
        record(
            c,
            partitions=kind[c.system][1],
            tls=kind[c.system][0],
            latencies_ms=None,
            rate=c.rate,
            p50_ms=c.percentile(0.5),
            p99_ms=c.percentile(0.99),
            cpu_ms_per_write=c.cpu_ms_per_write,
        )
        for c in cells
    ]
