"""A running stream follows the cluster's partitions as they grow: a query started on two
partitions reads the two added while it runs, from their first transaction, and the
output is the log, each transaction once."""

from __future__ import annotations

import time

import pytest
from spark_helpers import append, log_rows, spark_rows, stream

from waltz_client.cluster import admin
from waltz_client.cluster.zk import close

pytestmark = pytest.mark.timeout(300)


def test_a_running_stream_picks_up_partitions_added_while_it_runs(
    spark, make_cluster, tmp_path
) -> None:
    cluster = make_cluster(partitions=2)
    options = {"zookeeper": cluster.zookeeper_connect, "zkRoot": cluster.layout.root}
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    append(cluster, 20, [0, 1], tag="before")
    query = (
        stream(spark, options, startingOffsets="earliest")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="500 milliseconds")
        .start()
    )

    def written() -> list[tuple]:
        from pyspark.errors import AnalysisException

        try:
            return spark_rows(spark.read.parquet(str(out)))
        except AnalysisException:  # no micro-batch has written a file yet
            return []

    def wait_for_rows(count: int, what: str) -> list[tuple]:
        deadline = time.monotonic() + 180
        while len(rows := written()) < count:
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {len(rows)}"
            time.sleep(0.5)
        return rows

    try:
        wait_for_rows(20, "the first 20 transactions")
        zk = cluster.zk_connect()
        try:
            admin.add_partitions(zk, cluster.layout.root, 4)
        finally:
            close(zk)
        append(cluster, 40, [0, 1, 2, 3], tag="after")
        rows = wait_for_rows(60, "the transactions of the grown cluster")
    finally:
        query.stop()
    assert sorted({r[0] for r in rows}) == [0, 1, 2, 3]
    assert rows == sorted(log_rows(cluster))  # each transaction once, nothing else
