"""Commit times through Spark: the ``timestamp`` column, event-time windows and
watermarks, and positions by time (startingTimestamp, startingOffsetsByTimestamp,
endingTimestamp, endingOffsetsByTimestamp and the strategy), all against the commit
times the client reads back."""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass

import pytest
from spark_helpers import append, client, high_water_marks, read, run_to_the_end, stream

pytestmark = pytest.mark.timeout(300)

PARTITIONS = [0, 1, 2, 3]


@dataclass
class Bursts:
    """Two bursts of transactions with a pause between them, and every commit time of
    the log (partition -> [(transaction ID, commit time in ms)]) as the client reads it."""

    times: dict[int, list[tuple[int, int]]]
    first_a: int  # the first commit time of burst A
    between: int  # a time after all of A and before all of B
    last: int  # the last commit time of the log

    def select(self, low, high) -> list[tuple[int, int]]:
        """(partition, transaction ID) of each transaction committed at or after
        ``low(p)`` and before ``high(p)``."""
        return sorted(
            (p, txid)
            for p, rows in self.times.items()
            for txid, at in rows
            if low(p) <= at < high(p)
        )


def commit_times(cluster) -> dict[int, list[tuple[int, int]]]:
    with client(cluster) as c:
        return {
            p: [(r.transaction_id, r.timestamp) for r in c.read(p, 0, c.high_water_mark(p))]
            for p in range(c.num_partitions)
        }


@pytest.fixture(scope="module")
def bursts(cluster) -> Bursts:
    before = high_water_marks(cluster)
    append(cluster, 48, PARTITIONS, tag="time-a")
    middle = high_water_marks(cluster)
    time.sleep(1.6)  # commit times are ms: B is well after A
    append(cluster, 48, PARTITIONS, tag="time-b")
    times = commit_times(cluster)
    a = [at for p in PARTITIONS for txid, at in times[p] if before[p] < txid <= middle[p]]
    b = [at for p in PARTITIONS for txid, at in times[p] if txid > middle[p]]
    assert len(a) == len(b) == 48 and max(a) + 1000 < min(b), (a, b)
    everything = [at for rows in times.values() for _, at in rows]
    return Bursts(times, min(a), (max(a) + min(b)) // 2, max(everything))


def ids(df) -> list[tuple[int, int]]:
    return sorted((r.partition, r.transaction_id) for r in df.collect())


def test_the_timestamp_column_is_each_commit_time(spark, bursts, source_options):
    from pyspark.sql import functions as F
    from pyspark.sql.types import TimestampType

    df = read(spark, source_options)
    assert df.columns == ["partition", "transaction_id", "header", "data", "client_id", "timestamp"]
    assert isinstance(df.schema["timestamp"].dataType, TimestampType)
    rows = df.select("partition", "transaction_id", F.unix_micros("timestamp").alias("us"))
    got: dict[int, list[tuple[int, int]]] = {p: [] for p in bursts.times}
    for r in sorted(rows.collect()):
        got[r.partition].append((r.transaction_id, r.us))
    # Every transaction of this release has a time: microseconds, from the ms on the wire.
    assert got == {p: [(t, at * 1000) for t, at in rows] for p, rows in bursts.times.items()}
    for p, each in got.items():
        assert [us for _, us in each] == sorted(us for _, us in each), p  # non-decreasing


def test_event_time_windows_count_the_commits(spark, bursts, source_options):
    from pyspark.sql import functions as F

    counts = (
        read(spark, source_options)
        .groupBy(F.window("timestamp", "1 second"))
        .count()
        .select(F.unix_millis("window.start").alias("start"), "count")
        .collect()
    )
    expected = Counter(at // 1000 * 1000 for rows in bursts.times.values() for _, at in rows)
    assert {r.start: r["count"] for r in counts} == expected
    assert len(expected) >= 2  # the pause put the bursts in different windows


def test_positions_by_time_select_the_commits_in_range(spark, bursts, source_options):
    def by_time(**more: str) -> list[tuple[int, int]]:
        return ids(read(spark, source_options, **more))

    between = str(bursts.between)
    # A start is the first transaction at or after the time; an end is exclusive: the
    # read stops before the first transaction at or after it.
    assert by_time(startingTimestamp=between) == bursts.select(
        lambda p: bursts.between, lambda p: 2**62
    )
    assert by_time(endingTimestamp=between) == bursts.select(lambda p: 0, lambda p: bursts.between)
    burst_a = by_time(startingTimestamp=str(bursts.first_a), endingTimestamp=between)
    assert burst_a == bursts.select(lambda p: bursts.first_a, lambda p: bursts.between)
    assert len(burst_a) >= 48
    # Exactly at a commit time: that transaction starts a read, and is not in one that ends
    # there.
    exact = bursts.times[1][-3][1]
    only_1 = bursts.select(lambda p: 0 if p == 1 else 2**62, lambda p: 2**62)
    assert by_time(startingTimestamp=str(exact), partitions="1") == [
        (p, t) for p, t in only_1 if dict(bursts.times[1])[t] >= exact
    ]
    assert by_time(endingTimestamp=str(exact), partitions="1") == [
        (p, t) for p, t in only_1 if dict(bursts.times[1])[t] < exact
    ]
    assert (1, bursts.times[1][-3][0]) in by_time(startingTimestamp=str(exact), partitions="1")
    # One time a partition; a higher option overrides a lower one, as in Kafka.
    starts = {0: bursts.between, 1: bursts.first_a, 2: 0, 3: bursts.between}
    ends = {0: bursts.last + 1, 1: bursts.between, 2: bursts.between, 3: 2**50}
    got = by_time(
        startingOffsets="latest",
        startingOffsetsByTimestamp=json.dumps({str(p): t for p, t in starts.items()}),
        endingOffsets='{"0": 0, "1": 0, "2": 0, "3": 0}',
        endingOffsetsByTimestamp=json.dumps({str(p): t for p, t in ends.items()}),
    )
    assert got == bursts.select(starts.get, ends.get)
    assert {p for p, _ in got} == {0, 1, 2, 3}
    # An offset start and an end by time that cross are refused, naming both.
    with pytest.raises(Exception) as e:
        by_time(
            partitions="0",
            startingOffsets=json.dumps({"0": bursts.times[0][-1][0]}),
            endingTimestamp=str(bursts.first_a),
        )
    assert "endingTimestamp: partition 0 ends at" in str(e.value)


def test_nothing_at_or_after_the_time_fails_or_starts_at_the_end(spark, bursts, source_options):
    after = bursts.last + 60_000
    with pytest.raises(Exception) as e:  # Spark wraps it
        read(spark, source_options, startingTimestamp=str(after)).count()
    assert (
        f"startingTimestamp: partition 0 has no transaction committed at or after {after}"
    ) in str(e.value)
    # The same by partition; with the latest strategy that partition reads nothing.
    starts = {"0": after, "1": bursts.between, "2": after, "3": 0}
    more = {"startingOffsetsByTimestamp": json.dumps(starts)}
    with pytest.raises(Exception) as e:
        read(spark, source_options, **more).count()
    assert "startingOffsetsByTimestamp: partition 0 has no transaction" in str(e.value)
    got = ids(read(spark, source_options, startingOffsetsByTimestampStrategy="latest", **more))
    assert got == bursts.select(lambda p: int(starts[str(p)]), lambda p: 2**62)
    assert {p for p, _ in got} == {1, 3}


def test_a_stream_starts_at_the_first_commit_at_or_after_the_time(
    spark, cluster, bursts, source_options, tmp_path
):
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    df = stream(spark, source_options, startingTimestamp=str(bursts.between))
    assert sum(run_to_the_end(df, out, checkpoint)) == len(
        bursts.select(lambda p: bursts.between, lambda p: 2**62)
    )
    # A restarted query goes on from its checkpoint: the time applies to a new query only.
    append(cluster, 20, PARTITIONS, tag="time-c")
    run_to_the_end(df, out, checkpoint)
    again = Bursts(commit_times(cluster), bursts.first_a, bursts.between, 0)
    assert ids(spark.read.parquet(str(out))) == again.select(
        lambda p: bursts.between, lambda p: 2**62
    )


def test_a_watermarked_event_time_stream(spark, cluster, bursts, source_options, tmp_path):
    """Windows of one second from burst A on, with a watermark: burst B's times move it
    past every window of A, which are then final and written, with exact counts."""
    from pyspark.sql import functions as F

    windows = (
        stream(spark, source_options, startingTimestamp=str(bursts.first_a))
        .withWatermark("timestamp", "0 seconds")
        .groupBy(F.window("timestamp", "1 second"))
        .count()
        .select(F.unix_millis("window.start").alias("start"), "count")
    )
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    run_to_the_end(windows, out, checkpoint)
    written = {r.start: r["count"] for r in spark.read.parquet(str(out)).collect()}
    expected = Counter(
        at // 1000 * 1000
        for rows in commit_times(cluster).values()  # what the tests above wrote too
        for _, at in rows
        if at >= bursts.first_a
    )
    assert written and all(expected[start] == n for start, n in written.items()), written
    burst_a = {start for start in expected if start < bursts.between - 1000}
    assert burst_a <= set(written)
