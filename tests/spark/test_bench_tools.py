"""What `waltz spark bench` measures with: the source that reads nothing (Spark's own
cost for the same rows) and the CPU accounting of Spark's processes."""

from __future__ import annotations

import os

from waltz_client.spark.ceiling import CeilingDataSource


def test_the_ceiling_source_yields_the_rows_asked_for(spark):
    from pyspark.sql import functions as F

    spark.dataSource.register(CeilingDataSource)
    df = (
        spark.read.format("waltz-ceiling")
        .options(rows="10001", splits="3", size="100", batch="700")
        .load()
    )
    assert df.rdd.getNumPartitions() == 3
    row = df.agg(F.count("*"), F.sum(F.length("data")), F.countDistinct("transaction_id")).first()
    assert tuple(row) == (10001, 10001 * 100, 700)  # batches of 700 rows, reused
    assert df.schema.simpleString() == (
        "struct<partition:int,transaction_id:bigint,header:int,data:binary,client_id:bigint,"
        "timestamp:timestamp>"
    )


def test_the_bench_finds_the_spark_jvm_and_its_python_workers(spark):
    from waltz_client.spark.cli import _even_ranges, _process_groups

    class NoCluster:
        storages: list = []
        servers: list = []

    spark.range(10).count()
    groups = _process_groups(NoCluster())
    jvm = groups["Spark JVM"]()
    assert jvm and all(os.path.exists(f"/proc/{pid}") for pid in jvm)
    assert groups["storage nodes"]() == [] and os.getpid() not in groups["Spark Python workers"]()
    assert _even_ranges(4, 10) == ({0: 0, 1: 0, 2: 0, 3: 0}, {0: 3, 1: 3, 2: 2, 3: 2})
