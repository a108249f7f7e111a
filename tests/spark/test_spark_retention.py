"""The Spark source on a cluster with retention: "earliest" is the partition's log start,
and a range that starts below it fails the query naming the first available ID, or with
failOnDataLoss=false skips ahead to it and logs how many it skipped; in batch, in
streaming (a query restarted from a checkpoint that retention has overtaken), and in a
task that finds the log start moved after planning.

Its own small cluster (the shared one must keep everything), whose server applies the
retention policy every half second. Partition 0 serves the batch tests, partition 1
the streaming ones.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterator

import pytest
from spark_helpers import (
    append,
    log_rows,
    log_start,
    read,
    run_to_the_end,
    spark_rows,
    stream,
    truncate_before,
)

from waltz_client.blocking import BlockingWaltzClient
from waltz_client.client import WaltzError
from waltz_client.spark.options import parse_read_options
from waltz_client.spark.planning import Split
from waltz_client.spark.split_reader import client_config, read_split
from waltz_client.tools.local.cluster import LocalCluster

pytestmark = pytest.mark.timeout(300)

WORKER_LOGS = "spark.sql.pyspark.worker.logging.enabled"


@pytest.fixture(scope="module")
def retained(zookeeper, tmp_path_factory):
    local = LocalCluster(
        str(tmp_path_factory.mktemp("spark-retention")),
        storages=1,
        partitions=2,
        replicas=1,
        root=f"/waltz-spark-retention-{uuid.uuid4().hex}",
        servers=1,
        server_args=["--retention-interval", "0.5"],
        storage_args=["--segment-bytes", "4096"],  # whole segments really go
        external_zookeeper=zookeeper.connect_string,
    )
    local.start()
    try:
        yield local
    finally:
        local.stop()


@pytest.fixture
def options(retained) -> dict[str, str]:
    return {"zookeeper": retained.zookeeper_connect, "zkRoot": retained.layout.root}


@pytest.fixture(scope="module")
def truncated(retained) -> list[tuple]:
    """Partition 0: transactions 0..59 written, everything below 25 gone. What is kept."""
    append(retained, 60, [0], tag="batch")
    truncate_before(retained, 0, 25)
    kept = sorted(log_rows(retained, [0], start={0: 25}))
    assert [r[1] for r in kept] == list(range(25, 60))
    return kept


def worker_log_messages(spark) -> list[str]:
    return [r.msg for r in spark.tvf.python_worker_logs().select("msg").collect()]


def test_earliest_is_the_log_start(spark, retained, truncated, options):
    """startingOffsets defaults to earliest: each partition from its own log start, so
    failOnDataLoss (true by default) has nothing to object to."""
    everything = read(spark, options)
    other = log_rows(retained, [1], start={1: log_start(retained, 1)})
    assert spark_rows(everything) == sorted(truncated + other)


def test_a_batch_below_the_log_start_fails_naming_the_first_available(spark, truncated, options):
    with pytest.raises(Exception) as e:  # Spark wraps it
        read(spark, options, partitions="0", startingOffsets='{"0": 10}').collect()
    message = str(e.value)
    assert "partition 0: transactions 10..24 are no longer in the log" in message
    assert "the first available is 25" in message
    assert "set the option failOnDataLoss=false" in message


def test_a_batch_without_fail_on_data_loss_skips_to_the_log_start_and_logs_it(
    spark, truncated, options
):
    spark.conf.set(WORKER_LOGS, "true")
    try:
        df = read(
            spark, options, partitions="0", startingOffsets='{"0": 10}', failOnDataLoss="false"
        )
        assert spark_rows(df) == truncated
        logs = worker_log_messages(spark)
    finally:
        spark.conf.unset(WORKER_LOGS)
    assert any("partition 0: skipped 15 transactions (10..24)" in m for m in logs), logs


def test_a_task_that_finds_the_log_start_moved_since_planning(truncated, retained, caplog):
    """A split planned before retention moved the start (the reading task's own check,
    against the server's real TRUNCATED answer): the same failure, or the same skip."""
    where = {"zookeeper": retained.zookeeper_connect, "zkRoot": retained.layout.root}
    strict = parse_read_options({**where, "fetchRecords": "8"}, streaming=False)
    lossy = parse_read_options(
        {**where, "fetchRecords": "8", "failOnDataLoss": "false"}, streaming=False
    )
    # Its own client, closed here (not the worker's shared one, which lives until exit).
    with BlockingWaltzClient(client_config(strict)) as client:
        with pytest.raises(WaltzError) as e:
            list(read_split(strict, Split(0, 10, 60), client))
        with caplog.at_level(logging.WARNING, logger="waltz_client.spark"):
            batches = list(read_split(lossy, Split(0, 10, 60), client))
    assert "transactions 10..24 are no longer in the log; the first available is 25" in str(e.value)
    assert "failOnDataLoss=false" in str(e.value)
    ids = [t for b in batches for t in b.column("transaction_id").to_pylist()]
    assert ids == list(range(25, 60))
    assert "partition 0: skipped 15 transactions (10..24)" in caplog.text


def test_a_stream_restarted_behind_the_log_start_fails_or_skips_ahead_once(
    spark, retained, options, tmp_path
):
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    append(retained, 40, [1], tag="early")
    early = sorted(log_rows(retained, [1]))
    assert [r[1] for r in early] == list(range(40))
    df = stream(spark, options, partitions="1")  # from earliest
    assert sum(run_to_the_end(df, out, checkpoint)) == 40

    # Stopped at 40; 40 more come; retention drops everything below 60.
    append(retained, 40, [1], tag="late")
    truncate_before(retained, 1, 60)

    with pytest.raises(Exception) as e:
        run_to_the_end(df, out, checkpoint)
    message = str(e.value)
    assert "partition 1: transactions 40..59 are no longer in the log" in message
    assert "the first available is 60" in message
    assert "set the option failOnDataLoss=false" in message
    assert spark_rows(spark.read.parquet(str(out))) == early  # nothing written

    # failOnDataLoss=false: on from the log start, the rate limit counting from there.
    lossy = stream(
        spark, options, partitions="1", failOnDataLoss="false", maxTransactionsPerTrigger="7"
    )
    assert run_to_the_end(lossy, out, checkpoint) == [7, 7, 6]
    append(retained, 10, [1], tag="after")
    assert run_to_the_end(lossy, out, checkpoint) == [7, 3]
    kept = sorted(log_rows(retained, [1], start={1: 60}))
    assert [r[1] for r in kept] == list(range(60, 90))
    assert spark_rows(spark.read.parquet(str(out))) == sorted(early + kept)  # each once


def test_stream_planning_fails_or_skips_and_logs_on_the_driver(truncated, retained, caplog):
    """What a restarted stream does on the driver (in Spark, a Python process of its own,
    so its log is checked here): latestOffset fails naming the first available ID;
    without failOnDataLoss, it and partitions() start at the log start, and partitions()
    logs the skip."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    from waltz_client.spark.source import WaltzStreamReader

    @contextlib.contextmanager
    def reader(**more) -> Iterator[WaltzStreamReader]:
        given = {"zookeeper": retained.zookeeper_connect, "zkRoot": retained.layout.root}
        stream_reader = WaltzStreamReader(parse_read_options({**given, **more}, streaming=True))
        try:
            yield stream_reader
        finally:
            stream_reader.stop()  # its client and ZooKeeper session

    with reader(partitions="0") as strict:
        assert strict.initialOffset() == {"0": 25}  # earliest
        with pytest.raises(WaltzError, match="the first available is 25; set the option"):
            strict.latestOffset({"0": 10}, ReadAllAvailable())
        with pytest.raises(WaltzError, match=r"transactions 10\.\.24 are no longer in the log"):
            strict.partitions({"0": 10}, {"0": 40})
    with reader(partitions="0", startingOffsets='{"0": -2}') as minus_two:
        assert minus_two.initialOffset() == {"0": 25}

    with reader(partitions="0", failOnDataLoss="false") as lossy:
        assert lossy.latestOffset({"0": 10}, ReadMaxRows(5)) == {"0": 30}
        with caplog.at_level(logging.WARNING, logger="waltz_client.spark"):
            (split,) = [p.split for p in lossy.partitions({"0": 10}, {"0": 30})]
            assert split == Split(0, 25, 30)
            assert "partition 0: skipped 15 transactions (10..24)" in caplog.text
            # A range wholly below the log start reads nothing.
            (split,) = [p.split for p in lossy.partitions({"0": 3}, {"0": 20})]
            assert len(split) == 0
            assert "partition 0: skipped 17 transactions (3..19)" in caplog.text
