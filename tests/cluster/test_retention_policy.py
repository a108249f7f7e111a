"""The retention policy's pure core (where a partition's log may start) and the
``waltz cluster retention|truncate-before`` commands against a real ZooKeeper."""

from __future__ import annotations

import json

import pytest
from test_access import ERROR, waltz

from waltz_client.cluster import admin
from waltz_client.cluster.metadata import MetadataError
from waltz_client.cluster.paths import ClusterPaths
from waltz_client.cluster.retention import (
    RetentionPolicy,
    RetentionRule,
    SegmentInfo,
    format_duration,
    next_log_start,
    parse_duration,
)

NOW = 1_800_000_000_000
DAY = 86_400_000
# Four segments of 100 records and 1000 bytes, written 4, 3, 2 and 1 days ago; the last
# one is being written.
SEGMENTS = [SegmentInfo(100 * i, 100, 1000, NOW - (4 - i) * DAY) for i in range(4)]


def start(rule: RetentionRule, floor: int = 0, *, hwm: int = 399, current: int = 0) -> int:
    return next_log_start(rule, floor, SEGMENTS, now_ms=NOW, high_water_mark=hwm, current=current)


def test_keeping_everything_keeps_the_current_start() -> None:
    assert start(RetentionRule()) == 0
    assert start(RetentionRule(), current=150) == 150


def test_by_age_whole_segments_older_than_the_limit_go() -> None:
    assert start(RetentionRule(max_age_seconds=5 * 86400)) == 0
    assert start(RetentionRule(max_age_seconds=int(3.5 * 86400))) == 100
    assert start(RetentionRule(max_age_seconds=int(1.5 * 86400))) == 300
    # The segment being written never goes, however old.
    assert start(RetentionRule(max_age_seconds=1)) == 300


def test_by_size_the_newest_segments_within_the_limit_stay() -> None:
    assert start(RetentionRule(max_bytes=4000)) == 0
    assert start(RetentionRule(max_bytes=3999)) == 100
    assert start(RetentionRule(max_bytes=2500)) == 200
    assert start(RetentionRule(max_bytes=1)) == 300  # the last segment stays


def test_the_explicit_floor_lands_anywhere_but_never_past_what_is_committed() -> None:
    assert start(RetentionRule(), floor=150) == 150
    assert start(RetentionRule(max_bytes=2500), floor=250) == 250
    assert start(RetentionRule(), floor=10_000, hwm=399) == 400
    # Nothing uncommitted goes, whatever the rule says.
    assert start(RetentionRule(max_age_seconds=1), hwm=120) == 121
    # The start never moves down.
    assert start(RetentionRule(max_bytes=3999), current=350) == 350


def test_the_policy_round_trips_and_refuses_bad_documents() -> None:
    policy = (
        RetentionPolicy()
        .with_rule([None], RetentionRule(max_age_seconds=604800))
        .with_rule([2, 3], RetentionRule(max_bytes=1 << 30))
        .truncated_before(1, 500)
        .truncated_before(1, 200)  # never lowered
    )
    assert policy.floor(1) == 500 and policy.floor(0) == 0
    assert policy.rule_for(0) == RetentionRule(max_age_seconds=604800)
    assert policy.rule_for(3) == RetentionRule(max_bytes=1 << 30)
    assert RetentionPolicy.decode(policy.encode(), 4) == policy
    assert policy.without_rule([3, None]).rule_for(3) == RetentionRule()
    for bad, problem in [
        (b"[]", "expected a JSON object"),
        (b'{"extra": 1}', "unknown keys"),
        (b'{"default": {"max_age_seconds": 0}}', "max_age_seconds: expected null or"),
        (b'{"default": {"max_bytes": true}}', "max_bytes: expected null or"),
        (b'{"partitions": {"9": {}}}', "'9' is not a partition ID in 0..3"),
        (b'{"truncate_before": {"0": -1}}', "expected a transaction ID >= 0"),
    ]:
        with pytest.raises(MetadataError, match=problem):
            RetentionPolicy.decode(bad, 4)


def test_durations() -> None:
    assert [parse_duration(t) for t in ("90", "90s", "15m", "12h", "7d", "2w")] == [
        90,
        90,
        900,
        43200,
        604800,
        1209600,
    ]
    for bad in ("", "0", "7y", "-1d", "1.5h"):
        with pytest.raises(ValueError, match="expected a duration"):
            parse_duration(bad)
    assert format_duration(604800) == "1w" and format_duration(90) == "90s"


# --- the CLI -------------------------------------------------------------------------


@pytest.fixture
def cluster_root(zookeeper, zk_root) -> str:
    from waltz_client.cluster.zk import close, connect

    client = connect(zookeeper.connect_string, timeout=10.0)
    try:
        admin.create_cluster(client, zk_root, "ret", 4, 1, ["s0:9000"])
    finally:
        close(client)
    return zk_root


def test_the_cli_sets_shows_and_truncates(zookeeper, cluster_root) -> None:
    proc = waltz(zookeeper, cluster_root, "retention")
    assert proc.returncode == 0, proc.stderr
    assert "default: keep everything" in proc.stdout
    assert "every partition's log starts at transaction 0" in proc.stdout

    proc = waltz(zookeeper, cluster_root, "retention", "--partitions", "default", "--max-age", "7d")
    assert proc.returncode == 0, proc.stderr
    proc = waltz(
        zookeeper, cluster_root, "retention", "--partitions", "2-3", "--max-bytes", "10GiB"
    )
    assert proc.returncode == 0, proc.stderr
    proc = waltz(zookeeper, cluster_root, "truncate-before", "1", "1200")
    assert proc.returncode == 0, proc.stderr
    assert "partition 1: truncated before transaction 1200" in proc.stdout

    proc = waltz(zookeeper, cluster_root, "retention", "--json")
    assert json.loads(proc.stdout) == {
        "default": {"max_age_seconds": 604800, "max_bytes": None},
        "partitions": {
            "2": {"max_age_seconds": None, "max_bytes": 10 * 1024**3},
            "3": {"max_age_seconds": None, "max_bytes": 10 * 1024**3},
        },
        "truncate_before": {"1": 1200},
        "log_start": {"0": 0, "1": 0, "2": 0, "3": 0},
    }
    proc = waltz(zookeeper, cluster_root, "retention", "--partitions", "3", "--keep-all")
    assert proc.returncode == 0, proc.stderr
    assert "partition 3" not in proc.stdout.split("truncated")[0]


@pytest.mark.parametrize(
    "args, problem",
    [
        (("retention", "--partitions", "0"), "say what to change: --max-age"),
        (("retention", "--max-age", "7d"), "say which partitions"),
        (("retention", "--partitions", "0", "--max-age", "7y"), "expected a duration"),
        (("retention", "--partitions", "9", "--max-age", "7d"), "partition 9 is outside 0..3"),
        (("retention", "--partitions", "0", "--max-bytes", "lots"), "expected a size"),
        (("truncate-before", "4", "10"), "partition 4 is not in 0..3"),
        (("truncate-before", "0", "-5"), "TXID must be >= 0"),
    ],
)
def test_the_cli_refuses_bad_arguments_and_changes_nothing(
    zookeeper, cluster_root, args, problem
) -> None:
    from waltz_client.cluster.zk import close, connect

    proc = waltz(zookeeper, cluster_root, *args)
    assert proc.returncode == 1, proc.stderr
    assert f"{ERROR} {problem}" in proc.stderr
    client = connect(zookeeper.connect_string, timeout=10.0)
    try:
        assert not client.exists(ClusterPaths.of(cluster_root).retention)
    finally:
        close(client)


def test_by_age_a_segment_is_as_old_as_its_last_commit_not_its_file() -> None:
    # Segments a restore or a copy rewrote today, holding transactions committed 4, 3 and
    # 2 days ago: their files are new, their transactions are not.
    copied = [
        SegmentInfo(100 * i, 100, 1000, NOW - 60_000, last_commit_ms=NOW - (4 - i) * DAY)
        for i in range(4)
    ]
    rule = RetentionRule(max_age_seconds=int(2.5 * 86400))
    assert next_log_start(rule, 0, copied, now_ms=NOW, high_water_mark=399, current=0) == 200
    # Records written before commit times (none recorded): the file's age, as before.
    old = [SegmentInfo(s.first_txid, s.records, s.size_bytes, s.modified_ms) for s in copied]
    assert next_log_start(rule, 0, old, now_ms=NOW, high_water_mark=399, current=0) == 0
