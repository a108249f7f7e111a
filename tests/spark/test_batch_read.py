"""Batch reads through Spark equal the client's own range reads."""

from __future__ import annotations

import json

import pytest
from spark_helpers import append, high_water_marks, log_rows, read, spark_rows

from waltz_client.blocking import BlockingWaltzClient
from waltz_client.spark.options import parse_read_options
from waltz_client.spark.planning import Split
from waltz_client.spark.split_reader import client_config, read_split

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def filled(cluster):
    append(cluster, 600, [0, 1, 2], tag="batch")  # partition 3 stays empty
    return cluster


def test_a_batch_read_equals_the_client_range_reads(spark, filled, source_options):
    df = read(spark, source_options, maxTransactionsPerSplit="70")
    assert df.columns == [
        "partition",
        "transaction_id",
        "header",
        "data",
        "client_id",
        "timestamp",  # after the others: positional code keeps working
    ]
    expected = sorted(log_rows(filled))
    assert len(expected) >= 600
    assert spark_rows(df) == expected
    # 200 per partition in splits of at most 70 (plus what earlier tests wrote): >= 9 tasks
    assert df.rdd.getNumPartitions() >= 9


def test_partitions_and_offsets(spark, filled, source_options):
    hwm = high_water_marks(filled)
    start = {0: 17, 2: hwm[2] - 4}
    end = {0: 60, 2: hwm[2] + 1}
    df = read(
        spark,
        source_options,
        partitions="0,2",
        startingOffsets=json.dumps({str(p): t for p, t in start.items()}),
        endingOffsets=json.dumps({"0": 60, "2": -1}),
    )
    assert spark_rows(df) == sorted(log_rows(filled, [0, 2], start, end))
    assert {r[0] for r in spark_rows(df)} == {0, 2}
    # -2 is earliest; "latest" as a start reads nothing
    df = read(spark, source_options, partitions="1", startingOffsets='{"1": -2}')
    assert spark_rows(df) == sorted(log_rows(filled, [1]))
    assert read(spark, source_options, startingOffsets="latest").count() == 0
    # An empty partition reads as empty.
    assert read(spark, source_options, partitions="3").count() == len(log_rows(filled, [3]))


@pytest.mark.parametrize(
    ("more", "message"),
    [
        ({"zookeeper": ""}, "zookeeper: required"),
        ({"partitions": "0,9"}, "partitions: [9] do not exist"),
        ({"startingOffsets": '{"0": '}, "startingOffsets: not valid JSON"),
        (
            {"partitions": "0", "startingOffsets": '{"0": 5}', "endingOffsets": '{"0": 2}'},
            "endingOffsets: partition 0 ends at 2, before its starting offset 5",
        ),
        ({"maxTransactionsPerSplit": "0"}, "maxTransactionsPerSplit: expected an integer"),
    ],
)
def test_bad_options_fail_at_planning_naming_the_option(
    spark, filled, source_options, more, message
):
    with pytest.raises(Exception) as e:  # Spark wraps it: AnalysisException and the like
        read(spark, source_options, **more).count()
    assert message in str(e.value)


def test_a_split_read_goes_on_when_its_server_is_killed_mid_read(filled):
    """After the first batch of a split, the owner is SIGKILLed: the rest of the split
    comes from the server that takes the partition over, without a gap or a repeat."""
    append(filled, 1000, [1], tag="split")
    expected = [r[1] for r in log_rows(filled, [1])]
    options = parse_read_options(
        {
            "zookeeper": filled.zookeeper_connect,
            "zkRoot": filled.layout.root,
            "fetchRecords": "100",
        },
        streaming=False,
    )
    owner, generation = filled.owner_index(1)
    got: list[int] = []
    try:
        # Its own client, closed here: a worker's shared client would live until exit,
        # when kazoo's atexit hook can hang on a ZooKeeper already stopped.
        with BlockingWaltzClient(client_config(options)) as c:
            for batch in read_split(options, Split(1, 0, len(expected)), c):
                got.extend(batch.column("transaction_id").to_pylist())
                if filled.servers[owner].running:
                    filled.servers[owner].kill()
        assert got == expected
        assert filled.owner_index(1)[1] > generation  # it was taken over
    finally:
        filled.servers[owner].start()


def test_a_batch_job_survives_a_server_being_killed(spark, filled, source_options):
    """The owner of partition 0 is SIGKILLed as a job starts: planning and reads wait for
    the server that takes the partition over (the mid-read case is the test above), and
    the result is exact."""
    append(filled, 500, [0], tag="job")
    expected = sorted(log_rows(filled, [0]))
    owner, generation = filled.owner_index(0)
    filled.servers[owner].kill()
    try:
        df = read(spark, source_options, partitions="0", maxTransactionsPerSplit="100")
        assert spark_rows(df) == expected
        assert filled.owner_index(0)[1] > generation
    finally:
        filled.servers[owner].start()
