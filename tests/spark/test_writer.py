"""Writing DataFrames to the log: plain appends, locks that make a rerun harmless, and
bad input."""

from __future__ import annotations

import json

import pytest
from spark_helpers import high_water_marks, log_rows

pytestmark = pytest.mark.timeout(300)


def write(df, options, **more):
    writer = df.write.format("waltz").mode("append")
    for k, v in {**options, **more}.items():
        writer = writer.option(k, v)
    writer.save()


def rows_tagged(cluster, tag: bytes) -> list[tuple]:
    return [r for r in log_rows(cluster) if r[3].startswith(tag)]


def test_rows_are_appended_once_each(spark, cluster, source_options):
    df = spark.createDataFrame(
        [(i % 4, i, b"plain-%d" % i) for i in range(200)], "partition int, header int, data binary"
    )
    write(df.repartition(3), source_options)
    got = rows_tagged(cluster, b"plain-")
    assert sorted((p, h, d) for p, _, h, d, _ in got) == sorted(
        (i % 4, i, b"plain-%d" % i) for i in range(200)
    )


def test_write_locks_make_a_rerun_fail_instead_of_appending_twice(spark, cluster, source_options):
    schema = "partition int, header int, data binary, write_locks array<bigint>"
    df = spark.createDataFrame(
        [(i % 2, i, b"locked-%d" % i, [1000 + i]) for i in range(40)], schema
    )
    before = json.dumps({str(p): m for p, m in high_water_marks(cluster).items()})
    write(df, source_options, lockName="account")
    assert len(rows_tagged(cluster, b"locked-")) == 40
    marks = high_water_marks(cluster)

    # The whole job again, with the marks of its first run: every row's lock is taken.
    with pytest.raises(Exception) as e:
        write(df, source_options, lockName="account", lockHighWaterMark=before)
    assert "was not appended: a lock was taken by transaction" in str(e.value)
    assert "write_locks [10" in str(e.value)  # the row is named with its locks
    assert high_water_marks(cluster) == marks  # nothing appended twice

    # Within one job (as a retried task would), a row whose lock an earlier row took fails.
    twice = spark.createDataFrame([(0, 1, b"again-1", [7]), (0, 2, b"again-2", [7])], schema)
    with pytest.raises(Exception, match="a lock was taken by transaction"):
        write(twice.coalesce(1), source_options, lockName="account")
    assert len(rows_tagged(cluster, b"again-")) == 1

    # Against the client's current view (lockHighWaterMark=current) the locks are free.
    write(df.limit(2), source_options, lockName="account", lockHighWaterMark="current")
    assert len(rows_tagged(cluster, b"locked-")) == 42


@pytest.mark.parametrize(
    ("rows", "schema", "message"),
    [
        ([(0, b"x")], "partition int, data binary", "column 'header' is missing"),
        ([(0, 1, "x")], "partition int, header int, data string", "column 'data' is string"),
        ([(0, 1, b"x", 5)], "partition int, header int, data binary, extra int", "['extra']"),
        ([(9, 1, b"x")], "partition int, header int, data binary", "partition 9 does not exist"),
    ],
)
def test_bad_rows_fail_with_a_clear_message(spark, cluster, source_options, rows, schema, message):
    with pytest.raises(Exception) as e:
        write(spark.createDataFrame(rows, schema), source_options)
    assert message in str(e.value)


def test_a_stream_writes_to_the_log(spark, cluster, source_options, tmp_path):
    source = tmp_path / "source"
    spark.createDataFrame(
        [(i % 4, i, b"streamed-%d" % i) for i in range(50)],
        "partition int, header int, data binary",
    ).write.parquet(str(source))
    query = (
        spark.readStream.schema("partition int, header int, data binary")
        .parquet(str(source))
        .writeStream.format("waltz")
        .options(**source_options)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    assert sorted(r[2] for r in rows_tagged(cluster, b"streamed-")) == list(range(50))
