"""The source's options, offsets, splits and rate limit: pure decisions, no Spark."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from waltz_client.spark.options import (
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
    ],
)
def test_bad_read_options_name_the_option(options, streaming, message):
    with pytest.raises(WaltzOptionError) as e:
        parse_read_options(options, streaming=streaming)
    assert message in str(e.value)


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
