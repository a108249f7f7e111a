"""``waltz spark``: the Spark source's benchmark and example pipeline.

Registered through the ``waltz.commands`` entry point; pyspark is imported only
when a command runs, so ``waltz`` works without the spark extra.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from waltz_client.client import WaltzClient
from waltz_client.config import WaltzClientConfig
from waltz_client.runtime import event_loop
from waltz_client.runtime.process_cpu import cpu_seconds
from waltz_client.tools.demo.common import Put, check_at_least_one, fresh_cluster, open_loop
from waltz_client.tools.local.cluster import LocalCluster

from .planning import plan_splits

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def register(groups: argparse._SubParsersAction) -> None:
    spark = groups.add_parser("spark", help="the Spark source: benchmark and example pipeline")
    commands = spark.add_subparsers(dest="command", required=True, metavar="COMMAND")
    b = commands.add_parser("bench", help="batch read throughput and streaming latency")
    b.add_argument("--data-dir", default=".waltz-local/spark-bench", help="wiped and reused")
    b.add_argument("--transactions", type=int, default=1_000_000, help="to read (default 1e6)")
    b.add_argument("--size", type=int, default=1024, help="bytes each (default 1024)")
    b.add_argument("--partitions", type=int, default=4, help="partitions (default 4)")
    b.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    b.add_argument("--split", type=int, default=100_000, help="maxTransactionsPerSplit")
    b.add_argument("--stream-rate", type=float, default=5000.0, help="tx/s while streaming")
    b.add_argument("--stream-seconds", type=float, default=20.0, help="0: no streaming run")
    b.add_argument(
        "--ceiling",
        action="store_true",
        help="also time the same query over a source that reads nothing (Spark's own cost)",
    )
    b.set_defaults(func=cmd_bench)


def _config(cluster: LocalCluster) -> WaltzClientConfig:
    return WaltzClientConfig(
        cluster.zookeeper_connect,
        zk_root=cluster.layout.root,
        feed=False,
        max_outstanding_appends=2000,
        max_retries=1000,
    )


async def _fill(cluster: LocalCluster, count: int, size: int, partitions: int) -> float:
    payload = os.urandom(size)
    started = time.perf_counter()
    async with WaltzClient(_config(cluster)) as client:
        work = iter(range(count))

        async def worker() -> None:
            for i in work:
                result = await client.submit(Put(i % partitions, payload, header=i % partitions))
                if not result.committed:
                    raise RuntimeError(f"fill: {result.reason}")

        await asyncio.gather(*(worker() for _ in range(2000)))
    return time.perf_counter() - started


async def _produce_at(
    cluster: LocalCluster,
    rate: float,
    seconds: float,
    size: int,
    partitions: int,
    committed: dict[tuple[int, int], float],
) -> None:
    """Open loop at ``rate`` tx/s; ``committed[(partition, txid)]`` = commit time."""
    payload = os.urandom(size)
    async with WaltzClient(_config(cluster)) as client:

        async def one(i: int) -> None:
            result = await client.submit(Put(i % partitions, payload, header=i % partitions))
            if result.committed:
                committed[(i % partitions, result.transaction_id)] = time.time()

        await open_loop(rate, int(rate * seconds), one)


def _pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def cmd_bench(args: argparse.Namespace) -> int:
    if not check_at_least_one("waltz spark bench", args, "transactions", "partitions", "split"):
        return 2
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from waltz_client.spark import WaltzDataSource

    cluster = fresh_cluster(args.data_dir, args.partitions, 1, [])
    print(f"starting a local cluster: 3 storage nodes, 1 server, {args.partitions} partitions")
    cluster.start()
    spark = None
    try:
        seconds = event_loop.run(_fill(cluster, args.transactions, args.size, args.partitions))
        print(
            f"wrote {args.transactions:,} transactions of {args.size} bytes in {seconds:.1f} s "
            f"({args.transactions / seconds:,.0f} tx/s)"
        )
        spark = (
            SparkSession.builder.master(args.master)
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        spark.dataSource.register(WaltzDataSource)
        options = {"zookeeper": cluster.zookeeper_connect, "zkRoot": cluster.layout.root}

        def batch_read(source: str, **more: str) -> tuple[float, int, int]:
            started = time.perf_counter()
            df = spark.read.format(source).options(**more).load()
            row = df.agg(F.count("*"), F.sum(F.length("data"))).collect()[0]
            return time.perf_counter() - started, row[0], row[1]

        waltz = {**options, "maxTransactionsPerSplit": str(args.split)}
        batch_read("waltz", **waltz)  # warm: Python workers, JIT
        groups = _process_groups(cluster)
        before = {name: cpu_seconds(pids()) for name, pids in groups.items()}
        elapsed, rows, data_bytes = batch_read("waltz", **waltz)
        print(
            f"batch read ({args.master}, splits of {args.split:,}): {rows:,} transactions, "
            f"{data_bytes / 1e6:,.0f} MB in {elapsed:.2f} s: {rows / elapsed:,.0f} tx/s, "
            f"{data_bytes / elapsed / 1e6:,.0f} MB/s"
        )
        _print_cpu(groups, before, rows, elapsed)
        if args.ceiling:
            from .ceiling import CeilingDataSource

            spark.dataSource.register(CeilingDataSource)
            splits = len(plan_splits(*_even_ranges(args.partitions, rows), args.split))
            ceiling = {"rows": str(rows), "splits": str(splits), "size": str(args.size)}
            batch_read("waltz-ceiling", **ceiling)
            before = {name: cpu_seconds(pids()) for name, pids in groups.items()}
            elapsed, rows, _ = batch_read("waltz-ceiling", **ceiling)
            print(
                f"the same query over a source that reads nothing ({splits} splits): "
                f"{rows / elapsed:,.0f} rows/s"
            )
            _print_cpu(groups, before, rows, elapsed)
        if args.stream_seconds > 0:
            _stream_latency(spark, cluster, options, args)
    finally:
        if spark is not None:
            spark.stop()
        cluster.stop()
    print(f"{os.cpu_count()} CPUs ({platform.machine()}), fsync on")
    return 0


def _even_ranges(partitions: int, rows: int) -> tuple[dict[int, int], dict[int, int]]:
    """The ranges a read of ``rows`` written round robin over ``partitions`` covers."""
    return {p: 0 for p in range(partitions)}, {
        p: rows // partitions + (p < rows % partitions) for p in range(partitions)
    }


def _process_groups(cluster: LocalCluster) -> dict[str, Callable[[], list[int]]]:
    """Where the CPU goes: the cluster's daemons, and Spark's JVM and Python workers
    (found by their command lines: the workers come and go)."""

    def spark(marker: bytes) -> Callable[[], list[int]]:
        def pids() -> list[int]:
            found = []
            for name in os.listdir("/proc"):
                if name.isdigit():
                    try:
                        with open(f"/proc/{name}/cmdline", "rb") as f:
                            if marker in f.read():
                                found.append(int(name))
                    except OSError:
                        pass
            return found

        return pids

    def daemons(processes: list) -> Callable[[], list[int]]:
        return lambda: [p.pid for p in processes if p.pid is not None]

    return {
        "storage nodes": daemons(cluster.storages),
        "server": daemons(cluster.servers),
        "Spark JVM": spark(b"org.apache.spark.deploy.SparkSubmit"),
        "Spark Python workers": spark(b"pyspark.daemon"),
    }


def _print_cpu(
    groups: dict[str, Callable[[], list[int]]], before: dict[str, float], rows: int, elapsed: float
) -> None:
    used = {name: cpu_seconds(pids()) - before[name] for name, pids in groups.items()}
    each = ", ".join(f"{name} {s / max(rows, 1) * 1e6:.2f} us" for name, s in used.items())
    print(f"  CPU a row: {each} ({sum(used.values()) / elapsed:.2f} cores busy)")


def _stream_latency(
    spark: SparkSession, cluster: LocalCluster, options: dict, args: argparse.Namespace
) -> None:
    """Commit -> sink latency of a streaming query while a producer writes at a steady
    rate: the sink is a foreachBatch on the driver that notes when each transaction
    arrives."""
    committed: dict[tuple[int, int], float] = {}
    seen: dict[tuple[int, int], float] = {}

    def sink(batch_df: DataFrame, batch_id: int) -> None:
        rows = batch_df.select("partition", "transaction_id").collect()
        now = time.time()
        for r in rows:
            seen[(r.partition, r.transaction_id)] = now

    query = (
        spark.readStream.format("waltz")
        .options(**options)
        .option("startingOffsets", "latest")
        .load()
        .writeStream.foreachBatch(sink)
        .trigger(processingTime="0 seconds")
        .start()
    )
    try:
        time.sleep(5)  # the first (empty) micro-batches start the Python workers
        producer = threading.Thread(
            target=lambda: event_loop.run(
                _produce_at(
                    cluster,
                    args.stream_rate,
                    args.stream_seconds,
                    args.size,
                    args.partitions,
                    committed,
                )
            )
        )
        producer.start()
        producer.join()
        deadline = time.time() + 60
        while time.time() < deadline and not set(committed) <= set(seen):
            time.sleep(0.2)
    finally:
        query.stop()
    busy = [p for p in query.recentProgress if p["numInputRows"]]
    phases: dict[str, float] = {}
    for progress in busy:
        for phase, ms in progress["durationMs"].items():
            phases[phase] = phases.get(phase, 0) + ms / len(busy)
    latencies = sorted(seen[k] - t for k, t in committed.items() if k in seen)
    missing = len(set(committed) - set(seen))
    print(
        f"streaming at {args.stream_rate:,.0f} tx/s for {args.stream_seconds:g} s "
        f"(trigger as fast as possible): commit -> sink p50 {_pct(latencies, 0.5) * 1e3:,.0f} "
        f"ms, p99 {_pct(latencies, 0.99) * 1e3:,.0f} ms, max {latencies[-1] * 1e3:,.0f} ms; "
        f"{len(latencies):,} seen, {missing} missing"
    )
    print(
        f"micro-batches with data: {len(busy)} (last 100 kept), mean ms per phase: "
        + ", ".join(f"{k} {v:,.0f}" for k, v in sorted(phases.items(), key=lambda kv: -kv[1]))
    )
