"""The access policy's pure core (who may read or append which partition) and the
``waltz cluster access|grant|revoke|open-access`` commands against a real ZooKeeper."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from waltz_client.cluster import admin
from waltz_client.cluster.access import (
    DENY_ALL,
    OPEN_ACCESS,
    Access,
    AccessPolicy,
    PartitionRule,
)
from waltz_client.cluster.metadata import MetadataError
from waltz_client.cluster.paths import ClusterPaths
from waltz_client.cluster.zk import close, connect

ERROR = "waltz cluster: error:"


def test_no_rule_is_open_and_a_rule_lists_who_may_do_what() -> None:
    assert OPEN_ACCESS.allows(None, 3, Access.APPEND)
    policy = AccessPolicy(
        default=PartitionRule(read=("audit-*",)),
        partitions={0: PartitionRule(read=("svc",), append=("svc", "batch-?"))},
    )
    assert policy.allows("svc", 0, Access.READ)
    assert policy.allows("batch-1", 0, Access.APPEND)
    assert policy.allows("batch-1", 0, Access.FEED)  # appending needs the feed
    assert not policy.allows("batch-1", 0, Access.READ)
    assert not policy.allows("batch-12", 0, Access.APPEND)  # patterns match whole names
    assert not policy.allows("audit-x", 0, Access.READ)  # the partition's rule wins
    assert policy.allows("audit-x", 5, Access.READ)  # others fall back to the default
    assert policy.allows("audit-x", 5, Access.FEED)
    assert not policy.allows("audit-x", 5, Access.APPEND)
    assert not policy.allows(None, 5, Access.FEED)  # a rule needs a certificate identity
    assert not DENY_ALL.allows("anyone", 0, Access.FEED)


def test_grant_revoke_and_clear() -> None:
    policy = OPEN_ACCESS.granted([0, 1], "svc", read=True, append=False)
    policy = policy.granted([1, None], "svc", read=True, append=True)
    assert policy.partitions == {
        0: PartitionRule(read=("svc",)),
        1: PartitionRule(read=("svc",), append=("svc",)),
    }
    assert policy.default == PartitionRule(read=("svc",), append=("svc",))
    revoked = policy.revoked([0], "svc", read=True, append=True)
    # The rule stays, empty: revoking the last identity closes the partition.
    assert revoked.partitions[0] == PartitionRule()
    assert not revoked.allows("svc", 0, Access.FEED)
    cleared = revoked.cleared([0, None])
    assert cleared.default is None and set(cleared.partitions) == {1}
    assert cleared.allows("anyone", 0, Access.APPEND)  # no rule, no default: open


def test_the_znode_round_trips_and_bad_policies_are_refused_clearly() -> None:
    policy = AccessPolicy(PartitionRule(("a",)), {2: PartitionRule(("b",), ("c*",))})
    assert AccessPolicy.decode(policy.encode(), 3) == policy
    for data, problem in (
        (b"not json", "not JSON"),
        (b"[]", "expected a JSON object"),
        (b'{"rules": {}}', "unknown keys ['rules']"),
        (b'{"partitions": {"7": {"read": []}}}', "no partition '7'"),
        (b'{"partitions": {"x": {"read": []}}}', "no partition 'x'"),
        (b'{"partitions": {"0": {"read": "svc"}}}', "partitions.0.read: expected a list"),
        (b'{"partitions": {"0": {"read": [""]}}}', "non-empty identity patterns"),
        (b'{"default": {"write": []}}', "default: unknown keys ['write']"),
    ):
        with pytest.raises(MetadataError, match=problem.replace("[", r"\[").replace("]", r"\]")):
            AccessPolicy.decode(data, 3)


def test_describe_says_what_each_rule_allows() -> None:
    assert OPEN_ACCESS.describe() == [
        "no access rules: every client may read and append every partition"
    ]
    policy = AccessPolicy(partitions={1: PartitionRule(("r",), ())})
    assert policy.describe() == [
        "partition 1: read r; append nobody",
        "every other partition: open to every client",
    ]


# --- the CLI -------------------------------------------------------------------------


def waltz(zookeeper, root: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "waltz_client.tools.cli",
            "cluster",
            *args,
            "--zookeeper",
            zookeeper.connect_string,
            "--root",
            root,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def zk_client(zookeeper) -> Iterator[KazooClient]:
    client = connect(zookeeper.connect_string, timeout=10.0)
    try:
        yield client
    finally:
        close(client)


@pytest.fixture
def cluster_root(zookeeper, zk_client, zk_root) -> str:
    admin.create_cluster(zk_client, zk_root, "acc", 4, 1, ["s0:9000"])
    return zk_root


def test_the_cli_grants_revokes_and_shows_the_policy(zookeeper, zk_client, cluster_root) -> None:
    proc = waltz(zookeeper, cluster_root, "access")
    assert proc.returncode == 0
    assert "every client may read and append" in proc.stdout

    proc = waltz(
        zookeeper, cluster_root, "grant", "svc-*", "--partitions", "0-1,3", "--read", "--append"
    )
    assert proc.returncode == 0, proc.stderr
    proc = waltz(zookeeper, cluster_root, "revoke", "svc-*", "--partitions", "1", "--append")
    assert proc.returncode == 0, proc.stderr
    proc = waltz(zookeeper, cluster_root, "access", "--json")
    assert json.loads(proc.stdout) == {
        "partitions": {
            "0": {"read": ["svc-*"], "append": ["svc-*"]},
            "1": {"read": ["svc-*"], "append": []},
            "3": {"read": ["svc-*"], "append": ["svc-*"]},
        }
    }
    data, _ = zk_client.get(ClusterPaths.of(cluster_root).access)
    assert AccessPolicy.decode(data, 4).allows("svc-a", 1, Access.READ)

    proc = waltz(zookeeper, cluster_root, "open-access", "--partitions", "all")
    assert proc.returncode == 0, proc.stderr
    assert admin.read_access(zk_client, cluster_root)[0] == OPEN_ACCESS


@pytest.mark.parametrize(
    "args, problem",
    [
        (("grant", "svc", "--partitions", "0"), "say what to change: --read, --append or both"),
        (("grant", "svc", "--partitions", "4", "--read"), "partition 4 is outside 0..3"),
        (("revoke", "svc", "--partitions", "x", "--read"), "'x' is not a partition ID"),
    ],
)
def test_the_cli_refuses_bad_arguments_and_changes_nothing(
    zookeeper, zk_client, cluster_root, args, problem
) -> None:
    proc = waltz(zookeeper, cluster_root, *args)
    assert proc.returncode == 1, proc.stderr
    assert f"{ERROR} {problem}" in proc.stderr
    assert not zk_client.exists(ClusterPaths.of(cluster_root).access)


def test_an_unreadable_policy_is_reported_by_the_cli(zookeeper, zk_client, cluster_root) -> None:
    zk_client.create(ClusterPaths.of(cluster_root).access, b'{"partitions": 1}')
    proc = waltz(zookeeper, cluster_root, "access")
    assert proc.returncode == 1
    assert f"{ERROR} {cluster_root}/access: access policy: partitions must map" in proc.stderr
