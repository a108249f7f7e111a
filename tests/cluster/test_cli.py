"""``waltz cluster ...`` as an operator runs it: a child process against a real ZooKeeper.

Exit status 0 on success, 1 for a refused operation, 2 for usage and connection
errors; every error is one line on stderr starting ``waltz cluster: error:``.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from waltz_client.cluster import admin
from waltz_client.cluster import cli as cluster_cli
from waltz_client.cluster.metadata import (
    Ownership,
    PartitionMetadata,
    ReplicaState,
    ServerRegistration,
)
from waltz_client.cluster.partition_ranges import format_partition_ranges
from waltz_client.cluster.paths import ClusterPaths
from waltz_client.cluster.zk import close, connect

ERROR = "waltz cluster: error:"
STORAGES = "s0:9000,s1:9000,s2:9000"


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("WALTZ_ZOOKEEPER", "WALTZ_ROOT")}
    env.update(extra)
    return env


def waltz(
    *args: str, env: dict[str, str] | None = None, preexec_fn=None, timeout: float = 30.0
) -> subprocess.CompletedProcess:
    if args[:1] == ("create",) and not {"--zk-auth-file", "--zk-acl", "--zk-acl-cert"} & set(args):
        args = (*args, "--insecure")  # these tests are about the commands, not the ACLs
    return subprocess.run(
        [sys.executable, "-m", "waltz_client.tools.cli", "cluster", *args],
        capture_output=True,
        text=True,
        env=env if env is not None else clean_env(),
        timeout=timeout,
        preexec_fn=preexec_fn,
    )


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The one error line (kazoo may log connection attempts before it)."""
    lines = [line for line in proc.stderr.splitlines() if line.startswith(ERROR)]
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.fixture
def zk(zookeeper) -> Iterator[KazooClient]:
    client = connect(zookeeper.connect_string, timeout=10.0)
    try:
        yield client
    finally:
        close(client)


@pytest.fixture
def cli(zookeeper, zk_root):
    """Runs ``waltz cluster COMMAND --zookeeper ... --root <zk_root> ARGS``."""

    def run(command: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
        return waltz(
            command, "--zookeeper", zookeeper.connect_string, "--root", zk_root, *args, **kwargs
        )

    return run


def snapshot(zk: KazooClient, root: str) -> dict[str, tuple]:
    out: dict[str, tuple] = {}

    def walk(path: str) -> None:
        try:
            data, stat = zk.get(path)
            children = zk.get_children(path)
        except NoNodeError:
            return
        out[path] = (data, stat.mzxid, stat.version, stat.cversion)
        for child in children:
            walk(f"{path}/{child}")

    walk(root)
    return out


def create_args(*extra: str, partitions: int = 4) -> list[str]:
    return [
        "--name",
        "prod",
        "--partitions",
        str(partitions),
        "--replicas",
        "2",
        "--storage",
        STORAGES,
        *extra,
    ]


# --- create ---------------------------------------------------------------------------------


def test_create_text_then_again_idempotent(cli, zk, zk_root) -> None:
    first = cli("create", *create_args())
    assert first.returncode == 0, first.stderr
    key = admin.read_params(zk, zk_root).key
    assert first.stdout == (
        f"cluster 'prod' created at {zk_root}: 4 partitions x 2 replicas, key {key}\n"
    )
    before = snapshot(zk, zk_root)
    again = cli("create", *create_args())
    assert again.returncode == 0, again.stderr
    assert "already exists, unchanged" in again.stdout
    assert str(key) in again.stdout
    assert snapshot(zk, zk_root) == before


def test_create_json_with_key_groups_and_repeated_storage(cli, zk, zk_root) -> None:
    key = uuid.uuid4()
    args = [
        "--name",
        "prod",
        "--partitions",
        "6",
        "--replicas",
        "3",
        "--storage",
        "a:1@1,b:1@2",
        "--storage",
        "c:1@3",
        "--key",
        str(key),
        "--json",
    ]
    proc = cli("create", *args)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {
        "created": True,
        "root": zk_root,
        "key": str(key),
        "name": "prod",
    }
    assignment, _ = admin.read_assignment(zk, zk_root)
    assert assignment.groups == {"a:1": 1, "b:1": 2, "c:1": 3}
    assert all(len(assignment.replicas_of(p)) == 3 for p in range(6))
    again = cli("create", *args)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["created"] is False


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (create_args(partitions=8), "partitions is 4, requested 8"),
        (
            [
                "--name",
                "prod",
                "--partitions",
                "4",
                "--replicas",
                "2",
                "--storage",
                "s0:9000,s1:9000",
            ],
            "storage nodes are s0:9000,s1:9000,s2:9000, requested s0:9000,s1:9000",
        ),
        (
            create_args("--key", str(uuid.UUID(int=1))),
            "requested 00000000-0000-0000-0000-000000000001",
        ),
    ],
    ids=["partitions", "storages", "key"],
)
def test_conflicting_create_exits_1_and_changes_nothing(cli, zk, zk_root, args, fragment) -> None:
    assert cli("create", *create_args()).returncode == 0
    before = snapshot(zk, zk_root)
    proc = cli("create", *args)
    assert proc.returncode == 1
    assert proc.stdout == ""
    line = error_line(proc)
    assert "a different cluster already exists" in line
    assert fragment in line
    assert "nothing was changed" in line
    assert snapshot(zk, zk_root) == before


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--storage", "s0:9000,nohost"], "'nohost' is not host:port"),
        (["--storage", "s0:9000@x"], "group must be a number"),
        (["--storage", "s0:9000", "--replicas", "2"], "2 replicas need at least 2 storage nodes"),
    ],
)
def test_create_with_bad_storages_exits_1_and_writes_nothing(
    cli, zk, zk_root, args, fragment
) -> None:
    base = ["--name", "prod", "--partitions", "4", "--replicas", "1"]
    proc = cli("create", *base, *args)
    assert proc.returncode == 1, proc.stderr
    assert fragment in error_line(proc)
    assert zk.exists(zk_root) is None


def test_create_usage_errors_exit_2(cli) -> None:
    proc = cli(
        "create", "--name", "x", "--partitions", "four", "--replicas", "1", "--storage", "a:1"
    )
    assert proc.returncode == 2
    assert "--partitions" in proc.stderr and "invalid int value" in proc.stderr
    proc = cli("create", "--name", "x", "--partitions", "4", "--replicas", "1")
    assert proc.returncode == 2
    assert "--storage" in proc.stderr
    proc = cli("create", *create_args("--key", "not-a-uuid"))
    assert proc.returncode == 2
    assert "--key" in proc.stderr


# --- reading --------------------------------------------------------------------------------


def test_create_without_a_credential_or_insecure_is_refused(zookeeper, zk, zk_root) -> None:
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "waltz_client.tools.cli", "cluster", "create"),
            *("--zookeeper", zookeeper.connect_string, "--root", zk_root, *create_args()),
        ],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=30,
    )
    assert proc.returncode == 2, proc.stderr
    line = error_line(proc)
    assert "refusing to create metadata that anyone" in line and "--insecure" in line, line
    assert zk.exists(zk_root) is None  # nothing written
    both = waltz(
        "create",
        *("--zookeeper", zookeeper.connect_string, "--root", zk_root),
        *create_args("--insecure", "--zk-acl", "x509:CN=a"),
    )
    assert both.returncode == 2 and "--insecure: not with" in error_line(both)


def test_show_key_and_list(cli, zk, zookeeper, zk_root) -> None:
    assert cli("create", *create_args()).returncode == 0
    paths = ClusterPaths.of(zk_root)
    key = admin.read_params(zk, zk_root).key
    zk.set(
        paths.partition(1),
        PartitionMetadata(5, 9, {"s1:9000": ReplicaState(9, -1)}).encode(),
    )
    # old:9000, no longer assigned partition 2, is a member of its last writing session.
    zk.set(
        paths.partition(2),
        PartitionMetadata(5, 4, {"old:9000": ReplicaState(4, -2)}).encode(),
    )
    zk.set(paths.ownership, Ownership({0: ("srv-0", 2), 1: ("srv-0", 2)}).encode())
    server = connect(zookeeper.connect_string, timeout=10.0)
    try:
        reg = ServerRegistration("srv-0", "10.1.2.3", 9100, 9101)
        server.create(paths.server("srv-0"), reg.encode(), ephemeral=True)

        proc = cli("show", "--json")
        assert proc.returncode == 0, proc.stderr
        doc = json.loads(proc.stdout)
        assignment, _ = admin.read_assignment(zk, zk_root)
        assert doc["root"] == zk_root
        assert doc["name"] == "prod"
        assert doc["key"] == str(key)
        assert doc["num_partitions"] == 4 and doc["num_replicas"] == 2
        assert doc["storages"] == {
            s: {"group": 0, "partitions": sorted(ps)} for s, ps in assignment.storages.items()
        }
        assert sorted(doc["partitions"]) == ["0", "1", "2", "3"]
        assert doc["partitions"]["1"] == {
            "generation": 5,
            "session_id": 9,
            "replicas": {"s1:9000": {"session_id": 9, "closing_high_water_mark": -1}},
            "members": [],
            "log_start": 0,
            "owner": "srv-0",
            "owner_generation": 2,
        }
        assert doc["partitions"]["3"]["owner"] is None
        assert doc["partitions"]["2"]["members"] == ["old:9000"]
        assert doc["still_serving"] == {"old:9000": [2]}
        assert doc["servers"] == {"srv-0": {"host": "10.1.2.3", "port": 9100, "http_port": 9101}}
        assert doc["problems"] == []

        proc = cli("show")
        assert proc.returncode == 0, proc.stderr
        out = proc.stdout
        assert f"cluster 'prod' at {zk_root}" in out
        assert f"key {key}, 4 partitions, 2 replicas (quorum 2)" in out
        for s, ps in assignment.storages.items():
            assert any(line.split()[:1] == [s] for line in out.splitlines()), s
            assert len(ps) > 0
        assert "srv-0" in out and "10.1.2.3:9100" in out
        assert "still serving removed partitions for a vote" in out
        assert any(line.split() == ["old:9000", "2"] for line in out.splitlines())
        assert "PROBLEM" not in out
    finally:
        close(server)

    proc = cli("key")
    assert proc.returncode == 0 and proc.stdout == f"{key}\n"
    proc = cli("key", "--json")
    assert json.loads(proc.stdout) == {"key": str(key)}

    other = waltz(
        "create",
        "--zookeeper",
        zookeeper.connect_string,
        "--root",
        f"{zk_root}/nested/b",
        "--name",
        "b",
        "--partitions",
        "1",
        "--replicas",
        "1",
        "--storage",
        "x:1",
    )
    assert other.returncode == 0, other.stderr
    # a cluster below a cluster root is not looked for; list clusters under a parent instead
    proc = waltz("list", "--zookeeper", zookeeper.connect_string, "--under", zk_root, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [
        {"root": zk_root, "name": "prod", "num_partitions": 4, "num_replicas": 2}
    ]
    proc = waltz("list", "--zookeeper", zookeeper.connect_string, "--under", f"{zk_root}/nested")
    assert proc.returncode == 0, proc.stderr
    assert f"{zk_root}/nested/b" in proc.stdout and " b " in proc.stdout
    proc = waltz("list", "--zookeeper", zookeeper.connect_string, "--under", f"{zk_root}/none")
    assert proc.returncode == 0
    assert proc.stdout == f"no Waltz clusters under {zk_root}/none\n"


def test_list_finds_clusters_from_the_top(cli, zookeeper, zk_root) -> None:
    assert cli("create", *create_args()).returncode == 0
    proc = waltz("list", "--zookeeper", zookeeper.connect_string, "--json")
    assert proc.returncode == 0, proc.stderr
    assert {"root": zk_root, "name": "prod", "num_partitions": 4, "num_replicas": 2} in json.loads(
        proc.stdout
    )


def test_show_reports_problems_and_exits_1(cli, zk, zk_root) -> None:
    assert cli("create", *create_args()).returncode == 0
    zk.set(ClusterPaths.of(zk_root).partition(2), b"{oops")
    proc = cli("show")
    assert proc.returncode == 1
    assert f"PROBLEM: {zk_root}/store/partition/2: partition: not a JSON document" in proc.stdout
    proc = cli("show", "--json")
    assert proc.returncode == 1
    assert len(json.loads(proc.stdout)["problems"]) == 1


def test_missing_cluster_exits_1(cli, zk_root) -> None:
    for command in ("show", "key"):
        proc = cli(command)
        assert proc.returncode == 1
        assert f"no Waltz cluster at {zk_root}" in error_line(proc)


# --- changes --------------------------------------------------------------------------------


def test_storage_and_partition_changes(cli, zk, zk_root) -> None:
    assert cli("create", *create_args()).returncode == 0

    proc = cli("add-storage", "new:9000", "--group", "7", "--partitions", "0-1", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["new:9000"] == [0, 1]
    assert set(doc) == {"s0:9000", "s1:9000", "s2:9000", "new:9000"}
    assignment, _ = admin.read_assignment(zk, zk_root)
    assert assignment.storages["new:9000"] == {0, 1}
    assert assignment.groups["new:9000"] == 7

    proc = cli("assign", "new:9000", "2-3")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("assigned 2-3 to new:9000\n")
    assert any(line.split() == ["new:9000", "7", "0-3"] for line in proc.stdout.splitlines())
    assert admin.read_assignment(zk, zk_root)[0].storages["new:9000"] == {0, 1, 2, 3}

    proc = cli("unassign", "new:9000", "0,2", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["new:9000"] == [1, 3]

    proc = cli("unassign", "new:9000", "1,3")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("unassigned 1,3 from new:9000\n")
    assert any(line.split() == ["new:9000", "7", "-"] for line in proc.stdout.splitlines())

    proc = cli("remove-storage", "new:9000")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("removed new:9000\n")
    assert "new:9000" not in admin.read_assignment(zk, zk_root)[0].storages

    proc = cli("add-storage", "plain:1", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["plain:1"] == []
    proc = cli("remove-storage", "plain:1", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "plain:1" not in json.loads(proc.stdout)


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (("remove-storage", "s0:9000"), ["refusing to remove s0:9000", "fewer than 2 replicas"]),
        (("unassign", "s1:9000", "0-3"), ["refusing to unassign", "fewer than 2 replicas"]),
        (("remove-storage", "zz:1"), ["zz:1 is not in the cluster"]),
        (("replace-storage", "zz:1"), ["zz:1 is not in the cluster"]),
        (("replace-storage", "s0:9000", "--timeout", "0"), ["--timeout must be"]),
        (("add-storage", "s2:9000"), ["s2:9000 is already in the cluster"]),
        (("add-storage", "bad-address"), ["'bad-address' is not host:port"]),
        (("assign", "zz:1", "0"), ["zz:1 is not in the cluster; add it first"]),
        (("delete", "--confirm", "staging"), ["refusing to delete", "named 'prod'"]),
    ],
    ids=lambda a: " ".join(a) if isinstance(a, tuple) else None,
)
def test_refused_operations_exit_1_and_change_nothing(cli, zk, zk_root, args, fragments) -> None:
    assert cli("create", *create_args()).returncode == 0
    before = snapshot(zk, zk_root)
    proc = cli(*args)
    assert proc.returncode == 1
    assert proc.stdout == ""
    line = error_line(proc)
    for fragment in fragments:
        assert fragment in line
    assert snapshot(zk, zk_root) == before


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("assign", "s0:9000", "0-x"), "'0-x' is not a partition ID or a range"),
        (("assign", "s0:9000", "3-1"), "'3-1' is not a valid range"),
        (("assign", "s0:9000", "1,,2"), "empty item"),
        (("unassign", "s0:9000", "-1"), "'-1'"),
        (("assign", "s0:9000", "2,9"), "partitions [9] are outside 0..3"),
        (("add-storage", "n:1", "--partitions", "x"), "'x' is not a partition ID"),
        (("add-storage", "n:1", "--partitions", "4-5"), "partitions [4, 5] are outside 0..3"),
    ],
    ids=lambda a: " ".join(a) if isinstance(a, tuple) else None,
)
def test_bad_partition_ranges_exit_1_with_a_message(cli, zk, zk_root, args, fragment) -> None:
    assert cli("create", *create_args()).returncode == 0
    before = snapshot(zk, zk_root)
    proc = cli(*args)
    assert proc.returncode == 1
    assert fragment in error_line(proc)
    assert snapshot(zk, zk_root) == before


def _limit_memory() -> None:  # in the child, before exec
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


def test_huge_partition_range_is_refused_without_building_it(cli, zk, zk_root) -> None:
    """``assign`` parses the range before checking it against the partition count, so a typo
    like 0-99999999999 tries to build a set of 10^11 IDs. It should be refused at once."""
    assert cli("create", *create_args()).returncode == 0
    before = snapshot(zk, zk_root)
    proc = cli("assign", "s0:9000", "0-99999999999", preexec_fn=_limit_memory, timeout=60)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "beyond the largest ID" in error_line(proc)
    assert snapshot(zk, zk_root) == before


# --- delete ---------------------------------------------------------------------------------


def test_delete(cli, zk, zookeeper, zk_root) -> None:
    assert cli("create", *create_args()).returncode == 0
    server = connect(zookeeper.connect_string, timeout=10.0)
    try:
        server.create(
            ClusterPaths.of(zk_root).server("srv-9"),
            ServerRegistration("srv-9", "h", 1, 2).encode(),
            ephemeral=True,
        )
        before = snapshot(zk, zk_root)
        proc = cli("delete", "--confirm", "prod")
        assert proc.returncode == 1
        assert "servers srv-9 are still registered" in error_line(proc)
        assert "--force" in error_line(proc)
        assert snapshot(zk, zk_root) == before
        proc = cli("delete", "--confirm", "prod", "--force", "--json")
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout) == {"deleted": zk_root}
        assert zk.exists(zk_root) is None
    finally:
        close(server)
    assert cli("create", *create_args()).returncode == 0
    proc = cli("delete", "--confirm", "prod")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"deleted {zk_root}\n"
    assert zk.exists(zk_root) is None
    proc = cli("delete", "--confirm", "prod")
    assert proc.returncode == 1
    assert "no Waltz cluster" in error_line(proc)


def test_delete_requires_confirm(cli) -> None:
    proc = cli("delete")
    assert proc.returncode == 2
    assert "--confirm" in proc.stderr


# --- where ZooKeeper is ---------------------------------------------------------------------


def test_environment_gives_zookeeper_and_root(zookeeper, zk, zk_root) -> None:
    env = clean_env(WALTZ_ZOOKEEPER=zookeeper.connect_string, WALTZ_ROOT=zk_root)
    proc = waltz("create", *create_args(), env=env)
    assert proc.returncode == 0, proc.stderr
    assert zk_root in proc.stdout
    proc = waltz("key", env=env)
    assert proc.returncode == 0
    assert proc.stdout.strip() == str(admin.read_params(zk, zk_root).key)
    # a flag beats the environment
    proc = waltz("key", "--root", f"{zk_root}/other", env=env)
    assert proc.returncode == 1
    assert f"no Waltz cluster at {zk_root}/other" in error_line(proc)


@pytest.mark.parametrize(
    "args",
    [
        ["show"],
        ["key"],
        ["list"],
        ["create", *create_args()],
        ["delete", "--confirm", "x"],
        ["assign", "a:1", "0"],
    ],
    ids=lambda a: a[0],
)
def test_no_zookeeper_exits_2(args) -> None:
    proc = waltz(*args)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr == (
        f"{ERROR} no ZooKeeper: pass --zookeeper HOST:PORT or set WALTZ_ZOOKEEPER\n"
    )


def test_empty_zookeeper_environment_exits_2() -> None:
    proc = waltz("show", env=clean_env(WALTZ_ZOOKEEPER=""))
    assert proc.returncode == 2
    assert "no ZooKeeper" in error_line(proc)


@pytest.mark.parametrize("root", ["/", "", "/zookeeper/x", "/a/../b"])
def test_bad_root_exits_2(zookeeper, root) -> None:
    proc = waltz("show", "--zookeeper", zookeeper.connect_string, "--root", root)
    assert proc.returncode == 2
    assert "cluster root" in error_line(proc)


def test_bad_connect_string_exits_2_naming_it() -> None:
    proc = waltz("show", "--zookeeper", "127.0.0.1:notaport", timeout=20)
    assert proc.returncode == 2
    assert "127.0.0.1:notaport" in error_line(proc)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_zookeeper_exits_2_naming_the_address(monkeypatch, capsys) -> None:
    """Run in-process with a 1 s connect timeout: the CLI has no timeout option and waits the
    default 15 s (kazoo keeps retrying a refused connection until then)."""
    real_connect = cluster_cli.connect
    monkeypatch.setattr(
        cluster_cli, "connect", lambda hosts, **kw: real_connect(hosts, **kw, timeout=1.0)
    )
    address = f"127.0.0.1:{closed_port()}"
    from waltz_client.tools.cli import main

    with pytest.raises(SystemExit) as info:
        main(["cluster", "show", "--zookeeper", address, "--root", "/waltz"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"{ERROR} ZooKeeper at {address} did not answer within 1 s" in err


def test_add_partitions_grows_and_show_shows_the_grown_cluster(cli, zk, zk_root) -> None:
    assert cli("create", *create_args()).returncode == 0
    grown = cli("add-partitions", "--to", "6")
    assert grown.returncode == 0, grown.stderr
    assert "grew from 4 to 6 partitions" in grown.stdout
    again = cli("add-partitions", "--to", "6", "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["grown"] is False
    shown = json.loads(cli("show", "--json").stdout)
    assert shown["num_partitions"] == 6
    assert sorted(shown["partitions"]) == [str(p) for p in range(6)]
    assert all(len(v["replicas"]) == 0 for k, v in shown["partitions"].items() if k in ("4", "5"))
    text = cli("show")
    assert text.returncode == 0, text.stdout + text.stderr  # no problems: every replica placed


@pytest.mark.parametrize(
    ("to", "fragment"),
    [
        ("3", "partitions are never removed, so it cannot have 3"),
        ("0", "--to must be a partition count of at least 1"),
    ],
)
def test_add_partitions_refuses_fewer(cli, zk, zk_root, to, fragment) -> None:
    assert cli("create", *create_args()).returncode == 0
    before = snapshot(zk, zk_root)
    proc = cli("add-partitions", "--to", to)
    assert proc.returncode == 1 and fragment in proc.stderr, proc.stderr
    assert snapshot(zk, zk_root) == before


def test_replace_storage_moves_a_nodes_replicas_and_show_tells_it(cli, zk, zk_root) -> None:
    """On a cluster no session has written yet, nothing needs copying: one step places
    s0's replicas on the other nodes, the next gives them up and removes s0."""
    assert cli("create", *create_args()).returncode == 0
    assert cli("add-storage", "s3:9000").returncode == 0
    held = admin.read_assignment(zk, zk_root)[0].storages["s0:9000"]
    proc = cli("replace-storage", "s0:9000", "--json")
    assert proc.returncode == 0, proc.stderr
    step = json.loads(proc.stdout)
    assert sorted(p for ps in step["assigned"].values() for p in ps) == sorted(held)
    assert not step["finished"] and "s3:9000" in step["assigned"]  # the least loaded

    proc = cli("replace-storage", "s0:9000", "--wait", "--reason", "disk died")
    assert proc.returncode == 0, proc.stderr
    assert "s0:9000 gives up partitions" in proc.stdout
    assert "s0:9000 is replaced: it left the replica assignment" in proc.stdout
    assignment = admin.read_assignment(zk, zk_root)[0]
    assert "s0:9000" not in assignment.storages
    assert all(len(assignment.replicas_of(p)) == 2 for p in range(4))

    shown = cli("show")
    assert "storage replacements" in shown.stdout
    assert "s0:9000: started (waltz cluster replace-storage)" in shown.stdout
    for target, partitions in step["assigned"].items():
        moved = format_partition_ranges(partitions)
        assert f"s0:9000: assigned partitions {moved} to {target}" in shown.stdout
    assert "s0:9000: removed (left the replica assignment)" in shown.stdout
    doc = json.loads(cli("show", "--json").stdout)["replacements"]
    assert doc["replacing"] == {}
    actions = [e["action"] for e in doc["events"]]
    assert actions == ["started"] + ["assigned"] * len(step["assigned"]) + ["unassigned", "removed"]

    again = cli("replace-storage", "s0:9000")
    assert again.returncode == 1 and "s0:9000 is not in the cluster" in error_line(again)


def test_replace_storage_with_nowhere_to_go_says_so_and_exits_1(cli, zk, zk_root) -> None:
    three = ["--name", "prod", "--partitions", "2", "--replicas", "3", "--storage", STORAGES]
    assert cli("create", *three).returncode == 0
    before = admin.read_assignment(zk, zk_root)[0]
    proc = cli("replace-storage", "s0:9000", "--wait")
    assert proc.returncode == 1
    assert "no other reachable storage node can hold them" in proc.stdout
    assert "s0:9000 is not replaced yet (no other node can take some partitions)" in proc.stdout
    assert admin.read_assignment(zk, zk_root)[0] == before
