"""The source's options, offsets, splits and rate limit: pure decisions, no Spark."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from waltz_client.spark.options import (
    ByTime,
    WaltzOptionError,
    parse_read_options,
    parse_write_options,
)
from waltz_client.spark.planning import (
    Split,
    check_range,
    chosen_partitions,
    decode_offsets,
    encode_offsets,
    limit_offsets,
    plan_splits,
    resolve,
    resolve_by_time,
)

ZK = {"zookeeper": "127.0.0.1:2181"}


def test_defaults_and_case_insensitive_names():
    o = parse_read_options({"ZooKeeper": "zk:2181", "ZKROOT": "/prod/"}, streaming=False)
    assert (o.zookeeper, o.zk_root, o.partitions) == ("zk:2181", "/prod", None)
    assert (o.starting, o.ending, o.max_transactions_per_split) == ("earliest", "latest", 100_000)
    assert o.fail_on_data_loss and o.max_transactions_per_trigger is None


def test_partitions_offsets_and_limits_are_parsed():
    o = parse_read_options(
        {
            **ZK,
            "partitions": "0,2-3",
            "startingOffsets": '{"0": 5, "2": -2, "3": -1}',
            "maxTransactionsPerTrigger": "500",
            "failOnDataLoss": "False",
        },
        streaming=True,
    )
    assert o.partitions == {0, 2, 3}
    assert o.starting == {0: 5, 2: -2, 3: -1}
    assert o.max_transactions_per_trigger == 500 and not o.fail_on_data_loss


@pytest.mark.parametrize(
    ("options", "streaming", "message"),
    [
        ({}, False, "zookeeper: required"),
        ({**ZK, "partitions": "1,x"}, False, "partitions: 'x' is not a partition ID"),
        ({**ZK, "startingOffsets": '{"0": 1'}, False, "startingOffsets: not valid JSON"),
        ({**ZK, "startingOffsets": "[1]"}, False, "startingOffsets: expected earliest, latest"),
        ({**ZK, "startingOffsets": '{"a": 1}'}, False, "startingOffsets: 'a' is not a partition"),
        ({**ZK, "startingOffsets": '{"0": -3}'}, False, "startingOffsets: partition 0: expected"),
        ({**ZK, "endingOffsets": "earliest"}, False, "endingOffsets: 'earliest' would read"),
        ({**ZK, "endingOffsets": '{"0": -2}'}, False, "endingOffsets: -2 (earliest) is not"),
        (
            {**ZK, "startingOffsets": '{"0": 9}', "endingOffsets": '{"0": 3}'},
            False,
            "endingOffsets: partition 0 ends at 3, before its starting offset 9",
        ),
        ({**ZK, "endingOffsets": "latest"}, True, "endingOffsets: applies to batch reads only"),
        ({**ZK, "maxTransactionsPerTrigger": "9"}, False, "maxTransactionsPerTrigger: applies"),
        ({**ZK, "maxTransactionsPerTrigger": "0"}, True, "maxTransactionsPerTrigger: expected"),
        ({**ZK, "maxTransactionsPerSplit": "many"}, False, "maxTransactionsPerSplit: expected"),
        ({**ZK, "failOnDataLoss": "maybe"}, False, "failOnDataLoss: expected true or false"),
        ({**ZK, "requestTimeout": "-1"}, False, "requestTimeout: expected a positive"),
        ({**ZK, "zkRoot": "/"}, False, "zkRoot: the cluster root must name a znode"),
        ({**ZK, "startingOffset": "earliest"}, False, "unknown option 'startingoffset'"),
        # Positions by commit time (ms since the Unix epoch).
        ({**ZK, "startingTimestamp": "yesterday"}, False, "startingTimestamp: expected an integer"),
        ({**ZK, "startingTimestamp": "-1"}, True, "startingTimestamp: expected an integer from 0"),
        ({**ZK, "startingTimestamp": "1.5e12"}, False, "startingTimestamp: expected an integer"),
        ({**ZK, "endingTimestamp": ""}, False, "endingTimestamp: expected an integer"),
        ({**ZK, "startingOffsetsByTimestamp": "{"}, False, "startingOffsetsByTimestamp: not valid"),
        (
            {**ZK, "startingOffsetsByTimestamp": "[1]"},
            False,
            "startingOffsetsByTimestamp: expected a JSON object of partition -> commit time",
        ),
        (
            {**ZK, "startingOffsetsByTimestamp": '{"x": 1}'},
            False,
            "startingOffsetsByTimestamp: 'x' is not a partition ID",
        ),
        (
            {**ZK, "startingOffsetsByTimestamp": '{"0": -2}'},
            True,
            "startingOffsetsByTimestamp: partition 0: expected a commit time >= 0",
        ),
        (
            {**ZK, "endingOffsetsByTimestamp": '{"1": "1700000000000"}'},
            False,
            "endingOffsetsByTimestamp: partition 1: expected a commit time >= 0",
        ),
        (
            {**ZK, "endingOffsetsByTimestamp": '{"1": true}'},
            False,
            "endingOffsetsByTimestamp: partition 1: expected a commit time",
        ),
        (
            {**ZK, "startingTimestamp": "2000", "endingTimestamp": "1000"},
            False,
            "endingTimestamp: 1000 is before startingTimestamp 2000",
        ),
        (
            {
                **ZK,
                "startingOffsetsByTimestamp": '{"0": 10, "1": 3000}',
                "endingTimestamp": "2000",
            },
            False,
            "endingTimestamp: partition 1: 2000 is before startingOffsetsByTimestamp 3000",
        ),
        (
            {
                **ZK,
                "startingTimestamp": "3000",
                "endingOffsetsByTimestamp": '{"0": 5000, "1": 2999}',
            },
            False,
            "endingOffsetsByTimestamp: partition 1: 2999 is before startingTimestamp 3000",
        ),
        ({**ZK, "endingTimestamp": "5"}, True, "endingTimestamp: applies to batch reads only"),
        (
            {**ZK, "endingOffsetsByTimestamp": '{"0": 5}'},
            True,
            "endingOffsetsByTimestamp: applies to batch reads only",
        ),
        (
            {**ZK, "startingOffsetsByTimestampStrategy": "earliest"},
            False,
            "startingOffsetsByTimestampStrategy: expected error or latest, got 'earliest'",
        ),
        # An option a higher one overrides is still checked.
        (
            {**ZK, "startingTimestamp": "5", "startingOffsetsByTimestamp": "{}"},
            False,
            "startingOffsetsByTimestamp: expected a JSON object",
        ),
        (
            {**ZK, "startingTimestamp": "5", "startingOffsets": "now"},
            False,
            "startingOffsets: expected earliest, latest",
        ),
    ],
)
def test_bad_read_options_name_the_option(options, streaming, message):
    with pytest.raises(WaltzOptionError) as e:
        parse_read_options(options, streaming=streaming)
    assert message in str(e.value)


def test_positions_by_time_take_precedence_as_in_kafka():
    o = parse_read_options(
        {**ZK, "startingTimestamp": "1700000000000", "endingTimestamp": " 1700000005000 "},
        streaming=False,
    )
    assert o.starting == ByTime("startingTimestamp", 1_700_000_000_000)
    assert o.ending == ByTime("endingTimestamp", 1_700_000_005_000)
    assert o.by_timestamp_strategy == "error"  # the default, as in Kafka
    # startingTimestamp over startingOffsetsByTimestamp over startingOffsets (ending too).
    o = parse_read_options(
        {
            **ZK,
            "startingOffsets": '{"0": 4}',
            "startingOffsetsByTimestamp": '{"0": 20, "1": 30}',
            "startingTimestamp": "10",
            "endingOffsets": '{"0": 2}',  # before 4, but overridden: no conflict
            "endingOffsetsByTimestamp": '{"0": 50, "1": 60}',
            "startingOffsetsByTimestampStrategy": "LATEST",
        },
        streaming=False,
    )
    assert o.starting == ByTime("startingTimestamp", 10)
    assert o.ending == ByTime("endingOffsetsByTimestamp", {0: 50, 1: 60})
    assert o.by_timestamp_strategy == "latest"
    o = parse_read_options(
        {**ZK, "startingOffsets": "latest", "startingOffsetsByTimestamp": '{"2": 7}'},
        streaming=True,
    )
    assert o.starting == ByTime("startingOffsetsByTimestamp", {2: 7}) and o.ending == "latest"
    # An equal start and end reads nothing, and is allowed.
    assert parse_read_options(
        {**ZK, "startingTimestamp": "9", "endingTimestamp": "9"}, streaming=False
    ).ending == ByTime("endingTimestamp", 9)


def test_resolving_positions_by_time():
    """``find`` stands for the servers' time index: partition p's transaction i was
    committed at 1000 * i + p (p has ``LATEST[p]`` of them)."""
    asked = []

    def find(p: int, time: int) -> int:
        asked.append((p, time))
        i = -(-(time - p) // 1000)  # the first i with 1000 * i + p >= time
        return min(max(i, EARLIEST[p]), LATEST[p])

    parts = [0, 1, 2]
    start = resolve_by_time(ByTime("startingTimestamp", 3000), [0, 2], LATEST, find, ending=False)
    assert start == {0: 3, 2: 3} and asked == [(0, 3000), (2, 3000)]  # one call a partition
    # An end is exclusive: the first transaction at or after the time is not read.
    end = resolve_by_time(ByTime("endingTimestamp", 5001), [0, 2], LATEST, find, ending=True)
    assert end == {0: 6, 2: 5}
    # Nothing at or after the time: the end is latest; a start fails, naming the
    # partition and the time, or with the latest strategy starts at the end.
    late = ByTime("startingOffsetsByTimestamp", {0: 0, 1: 0, 2: 9000})
    with pytest.raises(WaltzOptionError) as e:
        resolve_by_time(late, parts, LATEST, find, ending=False)
    assert str(e.value).startswith(
        "startingOffsetsByTimestamp: partition 1 has no transaction committed at or after 0 "
        "(1970-01-01T00:00:00.000Z; its next transaction is 0)"
    )
    assert "startingOffsetsByTimestampStrategy=latest" in str(e.value)
    assert resolve_by_time(late, parts, LATEST, find, ending=False, strategy="latest") == {
        0: 0,
        1: 0,
        2: 7,
    }
    assert resolve_by_time(ByTime("e", 10**9), parts, LATEST, find, ending=True) == LATEST
    # The time index may know of transactions committed since latest was read: not ours.
    assert resolve_by_time(ByTime("e", 10**9), parts, {0: 5, 1: 0, 2: 7}, find, ending=True) == {
        0: 5,
        1: 0,
        2: 7,
    }
    # A JSON map names each partition read, and no other.
    with pytest.raises(WaltzOptionError, match=r"^s: no time for partitions \[1\]$"):
        resolve_by_time(ByTime("s", {0: 1, 2: 1}), parts, LATEST, find, ending=False)
    with pytest.raises(WaltzOptionError, match=r"^s: partitions \[7\] are not read"):
        resolve_by_time(ByTime("s", {0: 1, 1: 1, 2: 1, 7: 1}), parts, LATEST, find, ending=False)
    # An offset start and an end by time (or the other way) that cross name both.
    with pytest.raises(
        WaltzOptionError,
        match=r"^endingTimestamp: partition 0 ends at 3, before its starting offset 5$",
    ):
        check_range({0: 5}, {0: 3}, "endingTimestamp")
    with pytest.raises(WaltzOptionError, match=r"offset 5 \(from startingTimestamp\)$"):
        check_range({0: 5}, {0: 3}, "endingOffsets", "startingTimestamp")


def test_write_options():
    assert parse_write_options(ZK, streaming=False).lock_high_water_mark == "job"
    assert parse_write_options(ZK, streaming=True).lock_high_water_mark == "current"
    given = parse_write_options({**ZK, "lockHighWaterMark": '{"0": 5, "1": -1}'}, streaming=False)
    assert (given.lock_high_water_mark, given.lock_marks) == ("given", {0: 5, 1: -1})
    with pytest.raises(WaltzOptionError, match="lockHighWaterMark: only 'current' applies"):
        parse_write_options({**ZK, "lockHighWaterMark": "job"}, streaming=True)
    with pytest.raises(WaltzOptionError, match="lockHighWaterMark: expected job, current or"):
        parse_write_options({**ZK, "lockHighWaterMark": "now"}, streaming=False)
    with pytest.raises(WaltzOptionError, match="partition 0: expected a high-water mark >= -1"):
        parse_write_options({**ZK, "lockHighWaterMark": '{"0": -2}'}, streaming=False)
    with pytest.raises(WaltzOptionError, match="unknown option 'partitions'"):
        parse_write_options({**ZK, "partitions": "0"}, streaming=False)


EARLIEST = {0: 0, 1: 0, 2: 0}
LATEST = {0: 10, 1: 0, 2: 7}


def test_resolve_named_and_json_offsets():
    parts = [0, 1, 2]
    assert resolve("earliest", "s", parts, EARLIEST, LATEST) == EARLIEST
    assert resolve("latest", "s", parts, EARLIEST, LATEST) == LATEST
    assert resolve({0: 4, 1: -1, 2: -2}, "s", parts, EARLIEST, LATEST) == {0: 4, 1: 0, 2: 0}
    with pytest.raises(WaltzOptionError, match="s: no offset for partitions \\[2\\]"):
        resolve({0: 4, 1: -1}, "s", parts, EARLIEST, LATEST)
    with pytest.raises(WaltzOptionError, match="s: partitions \\[7\\] are not read"):
        resolve({0: 1, 1: 0, 2: 0, 7: 0}, "s", parts, EARLIEST, LATEST)
    with pytest.raises(WaltzOptionError, match="transaction 11 is beyond the end of the log"):
        resolve({0: 11, 1: 0, 2: 0}, "s", parts, EARLIEST, LATEST)
    with pytest.raises(WaltzOptionError, match="partition 0 ends at 3, before"):
        check_range({0: 5}, {0: 3})


def test_unknown_partitions_are_refused():
    assert chosen_partitions(None, 3) == [0, 1, 2]
    assert chosen_partitions({2, 0}, 3) == [0, 2]
    with pytest.raises(WaltzOptionError, match="partitions: \\[3, 9\\] do not exist"):
        chosen_partitions({0, 3, 9}, 3)


def test_splits_interleave_partitions():
    splits = plan_splits({0: 0, 1: 5, 2: 3}, {0: 25, 1: 5, 2: 4}, 10)
    assert splits == [Split(0, 0, 8), Split(2, 3, 4), Split(0, 8, 16), Split(0, 16, 25)]


offset_maps = st.dictionaries(st.integers(0, 5), st.integers(0, 500), min_size=1)


@given(offset_maps, st.lists(st.integers(0, 300), min_size=6, max_size=6), st.integers(1, 97))
def test_splits_cover_each_range_exactly_once(start, extra, size):
    end = {p: s + extra[p] for p, s in start.items()}
    splits = plan_splits(start, end, size)
    for p in start:
        mine = [s for s in splits if s.partition == p]
        covered = [t for s in mine for t in range(s.start, s.end)]
        assert covered == list(range(start[p], end[p]))
        assert all(0 < len(s) <= size for s in mine)
        assert len(mine) == -(-(end[p] - start[p]) // size)  # as few as fit
        assert max(map(len, mine), default=0) - min(map(len, mine), default=0) <= 1


@given(offset_maps, st.lists(st.integers(0, 300), min_size=6, max_size=6), st.integers(1, 400))
def test_the_rate_limit_is_exact_fair_and_makes_progress(start, extra, limit):
    latest = {p: s + extra[p] for p, s in start.items()}
    end = limit_offsets(start, latest, limit)
    waiting = sum(latest[p] - start[p] for p in start)
    taken = sum(end[p] - start[p] for p in start)
    assert taken == min(limit, waiting)  # never more than the limit, never less than can be
    assert all(start[p] <= end[p] <= latest[p] for p in start)
    for p in start:  # each partition gets at least its proportional share, rounded down
        assert end[p] - start[p] >= (latest[p] - start[p]) * min(limit, waiting) // max(waiting, 1)


def test_offsets_round_trip_through_json_keys():
    assert encode_offsets({2: 5, 0: 1}) == {"0": 1, "2": 5}
    assert decode_offsets({"0": 1, "2": 5}) == {0: 1, 2: 5}
    with pytest.raises(ValueError, match="not a waltz offset"):
        decode_offsets({"x": 1})


def test_tls_options_name_the_option_and_reach_the_client(tmp_path):
    from waltz_client.spark.split_reader import client_config
    from waltz_client.tools.local.certs import local_pki

    files = local_pki(str(tmp_path), {"waltz-client": ["127.0.0.1"]})["waltz-client"]
    options = {"zookeeper": "z:1", "tlsCert": files.cert, "tlsKey": files.key, "tlsCa": files.ca}
    read = parse_read_options(options, streaming=False)
    assert read.tls == files and client_config(read).tls == files
    assert parse_write_options(options, streaming=False).tls == files
    with pytest.raises(WaltzOptionError, match=r"^tlsKey: needed with tlsCert$"):
        parse_read_options(
            {"zookeeper": "z:1", "tlsCert": files.cert, "tlsCa": files.ca}, streaming=False
        )
    missing = str(tmp_path / "none.pem")
    with pytest.raises(WaltzOptionError, match=f"^tlsCa: {missing} does not exist$"):
        parse_write_options({"zookeeper": "z:1", "tlsCa": missing}, streaming=True)
    assert parse_read_options({"zookeeper": "z:1"}, streaming=True).tls is None
