"""Structured Streaming from the log: a rate limit per trigger, availableNow, and exactly
once across restarts, a failure inside a micro-batch included."""

from __future__ import annotations

import json
import os

import pytest
from spark_helpers import append, high_water_marks, log_rows, run_to_the_end, spark_rows, stream

pytestmark = pytest.mark.timeout(300)


def test_a_stream_reads_each_transaction_exactly_once_across_restarts_and_failures(
    spark, cluster, source_options, tmp_path
):
    from pyspark.sql.functions import col, udf
    from pyspark.sql.types import LongType

    out, checkpoint, poison = tmp_path / "out", tmp_path / "checkpoint", tmp_path / "poison"
    # From the end of what other tests wrote (the cluster is shared).
    start = {p: m + 1 for p, m in high_water_marks(cluster).items()}
    append(cluster, 120, [0, 1, 2, 3], tag="s1")
    df = stream(
        spark,
        source_options,
        maxTransactionsPerTrigger="50",
        startingOffsets=json.dumps({str(p): t for p, t in start.items()}),
    )

    # Run 1: all of it, at most 50 transactions per micro-batch.
    sizes = run_to_the_end(df, out, checkpoint)
    assert sum(sizes) == 120 and max(sizes) <= 50 and len(sizes) >= 3

    # Stopped between micro-batches; more is written; run 2 fails inside a micro-batch
    # (after other tasks of the batch may have written their files).
    append(cluster, 80, [0, 1, 2, 3], tag="s2")
    victim = high_water_marks(cluster)[2]
    marker = str(poison)

    @udf(LongType())
    def fail_once_on(transaction_id, partition):
        if partition == 2 and transaction_id == victim and os.path.exists(marker):
            raise RuntimeError("injected failure inside a micro-batch")
        return transaction_id

    poison.write_text("armed")
    failing = df.withColumn("transaction_id", fail_once_on(col("transaction_id"), col("partition")))
    with pytest.raises(Exception, match="injected failure"):
        run_to_the_end(failing, out, checkpoint)

    # Run 3: the same query from its checkpoint, the failure gone.
    poison.unlink()
    run_to_the_end(failing, out, checkpoint)
    assert spark_rows(spark.read.parquet(str(out))) == sorted(log_rows(cluster, start=start))


def test_starting_at_latest_reads_only_what_comes_after(spark, cluster, source_options, tmp_path):
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    append(cluster, 10, [0, 1], tag="before")
    df = stream(spark, source_options, startingOffsets="latest", partitions="0-1")
    assert sum(run_to_the_end(df, out, checkpoint)) == 0
    before = high_water_marks(cluster)
    append(cluster, 30, [0, 1], tag="after")
    run_to_the_end(df, out, checkpoint)
    start = {p: before[p] + 1 for p in (0, 1)}
    assert spark_rows(spark.read.parquet(str(out))) == sorted(log_rows(cluster, [0, 1], start))
