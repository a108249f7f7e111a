"""CreateCluster and the admin operations against a real ZooKeeper server.

Every test works under its own ``zk_root``. "Nothing changed" is checked by
comparing a snapshot of every znode under the root (data, mzxid, version,
cversion, ephemeral owner) before and after.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoNodeError

from waltz_client.cluster import admin
from waltz_client.cluster.errors import ClusterError
from waltz_client.cluster.metadata import (
    NO_SESSION,
    UNRESOLVED,
    ClusterParams,
    Ownership,
    PartitionMetadata,
    ReplicaAssignment,
    ReplicaState,
    ServerRegistration,
)
from waltz_client.cluster.partition_ranges import format_partition_ranges
from waltz_client.cluster.paths import ClusterPaths
from waltz_client.cluster.placement import assign_replicas
from waltz_client.cluster.zk import close, connect

STORAGES = ["s0:9000", "s1:9000", "s2:9000"]


@pytest.fixture
def zk(zookeeper) -> Iterator[KazooClient]:
    client = connect(zookeeper.connect_string, timeout=10.0)
    try:
        yield client
    finally:
        close(client)


@pytest.fixture
def clients(zookeeper) -> Iterator[Callable[[], KazooClient]]:
    """Opens further clients (own sessions), all closed at teardown."""
    opened: list[KazooClient] = []

    def open_one() -> KazooClient:
        client = connect(zookeeper.connect_string, timeout=10.0)
        opened.append(client)
        return client

    yield open_one
    for client in opened:
        close(client)


def snapshot(zk: KazooClient, root: str) -> dict[str, tuple]:
    """Every znode at and below ``root``: (data, mzxid, version, cversion, ephemeralOwner)."""
    out: dict[str, tuple] = {}

    def walk(path: str) -> None:
        try:
            data, stat = zk.get(path)
            children = zk.get_children(path)
        except NoNodeError:
            return
        out[path] = (data, stat.mzxid, stat.version, stat.cversion, stat.ephemeralOwner)
        for child in children:
            walk(f"{path}/{child}")

    walk(root)
    return out


def run_threads(n: int, target: Callable[[int], object]) -> list[object]:
    """Run ``target(i)`` in n threads; their results (or the exception each raised)."""
    results: list[object] = [None] * n

    def body(i: int) -> None:
        try:
            results[i] = target(i)
        except BaseException as e:
            results[i] = e

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive(), "a worker thread hung"
    return results


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def create(zk: KazooClient, root: str, **kwargs) -> admin.CreateResult:
    args = {
        "name": "prod",
        "num_partitions": 6,
        "num_replicas": 2,
        "storages": list(STORAGES),
    }
    args.update(kwargs)
    return admin.create_cluster(zk, root, **args)


# --- create ---------------------------------------------------------------------------------


def test_create_writes_every_node(zk, zk_root) -> None:
    key = uuid.uuid4()
    result = create(zk, zk_root, key=key, groups={"s0:9000": 1, "s1:9000": 2, "s2:9000": 3})
    assert result.created
    paths = ClusterPaths.of(zk_root)

    params = ClusterParams.decode(zk.get(paths.cluster)[0])
    assert params == ClusterParams("prod", key, 6, 2) == result.params
    assignment = ReplicaAssignment.decode(zk.get(paths.assignment)[0])
    expected = assign_replicas(STORAGES, 6, 2, {"s0:9000": 1, "s1:9000": 2, "s2:9000": 3})
    assert assignment == expected == result.assignment
    assert zk.exists(paths.store) is not None
    assert sorted(zk.get_children(paths.partitions), key=int) == [str(p) for p in range(6)]
    for p in range(6):
        assert PartitionMetadata.decode(zk.get(paths.partition(p))[0]) == PartitionMetadata(
            0, NO_SESSION, {}
        )
    assert zk.get_children(paths.servers) == []
    ownership = Ownership.decode(zk.get(paths.ownership)[0])
    assert ownership == Ownership({p: (None, 0) for p in range(6)})
    assert zk.get_children(paths.client_ids) == []
    assert set(zk.get_children(paths.root)) == {
        "cluster",
        "store",
        "servers",
        "ownership",
        "client-ids",
    }
    assert set(zk.get_children(paths.store)) == {"assignment", "partition"}
    nodes = snapshot(zk, paths.root)
    assert all(owner == 0 for *_, owner in nodes.values())  # everything is persistent
    # ... and all of it was written by one transaction: one zxid for every node
    assert len({zk.exists(path).czxid for path in nodes}) == 1


def test_create_generates_a_key_when_none_is_given(zk, zk_root) -> None:
    result = create(zk, zk_root)
    assert isinstance(result.params.key, uuid.UUID)
    assert admin.read_params(zk, zk_root).key == result.params.key
    other = create(zk, f"{zk_root}/other")
    assert other.params.key != result.params.key


def test_create_below_missing_parents_and_normalised_root(zk, zk_root) -> None:
    result = create(zk, f"{zk_root}/a/b/")
    assert result.created
    assert zk.exists(f"{zk_root}/a/b/cluster") is not None
    assert admin.read_params(zk, f"//{zk_root[1:]}/a//b").name == "prod"


def test_create_under_an_existing_empty_root(zk, zk_root) -> None:
    zk.create(zk_root, b"operator was here")
    assert create(zk, zk_root).created
    assert zk.get(zk_root)[0] == b"operator was here"  # the root's data is left alone


def test_create_again_with_the_same_arguments_changes_nothing(zk, zk_root) -> None:
    key = uuid.uuid4()
    first = create(zk, zk_root, key=key)
    before = snapshot(zk, zk_root)
    again = create(zk, zk_root, key=key)
    assert not again.created
    assert again.params == first.params
    assert again.assignment == first.assignment
    # without the key it is the same cluster too, and reports the key it has
    no_key = create(zk, zk_root)
    assert not no_key.created and no_key.params.key == key
    # storages in another order are the same set
    reordered = create(zk, zk_root, key=key, storages=list(reversed(STORAGES)))
    assert not reordered.created
    assert snapshot(zk, zk_root) == before


@pytest.mark.parametrize(
    ("change", "fragments"),
    [
        ({"num_partitions": 8}, ["partitions is 6, requested 8"]),
        ({"num_replicas": 3}, ["replicas is 2, requested 3"]),
        ({"name": "staging"}, ["name is prod, requested staging"]),
        (
            {"storages": ["s0:9000", "s1:9000"]},
            ["storage nodes are s0:9000,s1:9000,s2:9000, requested s0:9000,s1:9000"],
        ),
        ({"storages": [*STORAGES, "s3:9000"]}, ["requested s0:9000,s1:9000,s2:9000,s3:9000"]),
        ({"key": uuid.UUID(int=7)}, ["key is", "requested 00000000-0000-0000-0000-000000000007"]),
        (
            {"name": "x", "num_partitions": 1, "num_replicas": 1},
            ["name is prod", "partitions is 6, requested 1", "replicas is 2, requested 1"],
        ),
    ],
    ids=["partitions", "replicas", "name", "fewer-storages", "more-storages", "key", "several"],
)
def test_create_with_conflicting_arguments_is_refused(zk, zk_root, change, fragments) -> None:
    create(zk, zk_root, key=uuid.uuid4())
    before = snapshot(zk, zk_root)
    with pytest.raises(ClusterError) as info:
        create(zk, zk_root, **change)
    message = str(info.value)
    assert f"a different cluster already exists at {zk_root}" in message
    assert "nothing was changed" in message
    for fragment in fragments:
        assert fragment in message
    assert snapshot(zk, zk_root) == before


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"storages": ["s0:9000", "bad"]}, "'bad' is not host:port"),
        ({"storages": ["s0:9000", "s0:9000"]}, "listed twice"),
        ({"num_replicas": 4}, "4 replicas need at least 4 storage nodes"),
        ({"num_partitions": 0}, "partitions must be at least 1"),
        ({"num_replicas": 0}, "replicas must be at least 1"),
        ({"name": "  "}, "name must not be empty"),
    ],
)
def test_create_with_bad_arguments_writes_nothing(zk, zk_root, change, fragment) -> None:
    with pytest.raises(ClusterError, match=fragment):
        create(zk, f"{zk_root}/c", **change)
    assert zk.exists(zk_root) is None


@pytest.mark.parametrize("existing", ["servers", "store/partition/3", "client-ids"])
def test_failed_create_transaction_leaves_no_partial_writes(zk, zk_root, existing) -> None:
    """A leftover node makes the transaction fail: nothing else may be created."""
    zk.ensure_path(f"{zk_root}/{existing}")
    before = snapshot(zk, zk_root)
    with pytest.raises(ClusterError):
        create(zk, zk_root)
    assert snapshot(zk, zk_root) == before
    with pytest.raises(ClusterError, match="no Waltz cluster"):
        admin.read_params(zk, zk_root)


def test_failed_create_transaction_names_the_node_in_the_way(zk, zk_root) -> None:
    """The refusal should name the leftover node, not blame concurrent changes: nobody else
    is writing, and no number of retries can succeed."""
    zk.ensure_path(f"{zk_root}/servers")
    with pytest.raises(ClusterError) as info:
        create(zk, zk_root)
    message = str(info.value)
    assert f"{zk_root}/servers" in message, message
    assert "concurrent" not in message, message


def test_create_too_large_for_one_transaction_is_a_cluster_error(zk, zk_root) -> None:
    """8000 partitions make the create transaction larger than ZooKeeper's default request
    limit (jute.maxbuffer, 1 MB): the server drops the connection. The caller (and the CLI,
    which only handles ClusterError) should get a ClusterError saying so, not kazoo's bare
    ConnectionLoss; and nothing may be written."""
    try:
        result = create(zk, zk_root, num_partitions=8000, num_replicas=1)
    except ClusterError as e:
        assert "8000" in str(e) or "too large" in str(e), e
        assert wait_until(lambda: zk.connected)
        assert zk.exists(zk_root) is None
    else:  # a release that splits the writes may succeed; then it must be complete
        assert result.created
        assert admin.read_cluster(zk, zk_root).problems == []


def test_concurrent_creates_exactly_one_wins(zk, clients, zk_root) -> None:
    n = 8
    root = f"{zk_root}/race"  # neither the root nor its parent exists yet
    workers = [clients() for _ in range(n)]
    barrier = threading.Barrier(n)

    def body(i: int) -> admin.CreateResult:
        barrier.wait()
        return create(workers[i], root)

    results = run_threads(n, body)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors
    assert sorted(r.created for r in results) == [False] * (n - 1) + [True]
    stored = admin.read_params(zk, root)
    assert {r.params.key for r in results} == {stored.key}  # the losers report the winner's key
    assert len({r.assignment.encode() for r in results}) == 1
    state = admin.read_cluster(zk, root)
    assert state.problems == []
    assert sorted(state.partitions) == list(range(6))


def test_concurrent_conflicting_creates_one_wins_the_rest_are_refused(zk, clients, zk_root) -> None:
    n = 5
    workers = [clients() for _ in range(n)]
    barrier = threading.Barrier(n)

    def body(i: int) -> admin.CreateResult:
        barrier.wait()
        return create(workers[i], zk_root, name=f"cluster-{i}")

    results = run_threads(n, body)
    winners = [i for i, r in enumerate(results) if isinstance(r, admin.CreateResult)]
    assert len(winners) == 1, results
    assert results[winners[0]].created
    name = admin.read_params(zk, zk_root).name
    assert name == f"cluster-{winners[0]}"
    for i, r in enumerate(results):
        if i != winners[0]:
            assert isinstance(r, ClusterError), r
            assert f"name is {name}, requested cluster-{i}" in str(r)


# --- compare-and-set ------------------------------------------------------------------------


def test_concurrent_cas_on_partition_metadata_exactly_one_wins_per_round(
    zk, clients, zk_root
) -> None:
    create(zk, zk_root)
    path = ClusterPaths.of(zk_root).partition(2)
    n, rounds = 5, 6
    workers = [clients() for _ in range(n)]
    barrier = threading.Barrier(n)
    outcome: list[list[str]] = [[] for _ in range(rounds)]
    lock = threading.Lock()

    def body(i: int) -> None:
        for r in range(rounds):
            data, stat = workers[i].get(path)
            meta = PartitionMetadata.decode(data)
            barrier.wait()  # everyone has read the same version before anyone writes
            new = PartitionMetadata(
                meta.generation + 1,
                meta.session_id + 1 + i,
                {"s0:9000": ReplicaState(meta.session_id + 1 + i)},
            )
            try:
                workers[i].set(path, new.encode(), version=stat.version)
                result = "won"
            except BadVersionError:
                result = "lost"
            with lock:
                outcome[r].append(result)
            barrier.wait()  # the round is over before anyone reads again

    errors = [e for e in run_threads(n, body) if e is not None]
    assert not errors, errors
    for r in range(rounds):
        assert sorted(outcome[r]) == ["lost"] * (n - 1) + ["won"], (r, outcome[r])
    data, stat = zk.get(path)
    final = PartitionMetadata.decode(data)
    assert final.generation == rounds  # no lost update, no double bump
    assert stat.version == rounds


def test_concurrent_assignment_changes_all_land(zk, clients, zk_root) -> None:
    create(zk, zk_root, num_partitions=16, num_replicas=1, storages=["s0:9000"])
    n = 8
    extra = [f"x{i}:9000" for i in range(n)]
    workers = [clients() for _ in range(n)]
    barrier = threading.Barrier(n)

    def add(i: int) -> None:
        barrier.wait()
        admin.add_storage(workers[i], zk_root, extra[i], group=i)

    assert run_threads(n, add) == [None] * n

    def assign(i: int) -> None:
        barrier.wait()
        admin.assign_partitions(workers[i], zk_root, extra[i], {i, i + 8})

    assert run_threads(n, assign) == [None] * n
    assignment, version = admin.read_assignment(zk, zk_root)
    assert assignment.storages["s0:9000"] == frozenset(range(16))
    for i in range(n):
        assert assignment.storages[extra[i]] == frozenset({i, i + 8})
        assert assignment.groups[extra[i]] == i
    assert version == 2 * n  # one successful write per change


def test_update_assignment_retries_on_a_lost_race(zk, clients, zk_root) -> None:
    """The change function runs again on the new state when the CAS loses."""
    create(zk, zk_root)
    other = clients()
    calls: list[frozenset] = []

    def change(current: ReplicaAssignment, params: ClusterParams) -> ReplicaAssignment:
        calls.append(frozenset(current.storages))
        if len(calls) == 1:  # someone else writes between our read and our write
            admin.add_storage(other, zk_root, "racer:1")
        return ReplicaAssignment(
            {**current.storages, "mine:1": frozenset()}, {**current.groups, "mine:1": 0}
        )

    admin.update_assignment(zk, zk_root, change)
    assert len(calls) == 2
    assert "racer:1" in calls[1]
    final, _ = admin.read_assignment(zk, zk_root)
    assert {"racer:1", "mine:1"} <= set(final.storages)


def test_unchanged_assignment_is_not_written(zk, zk_root) -> None:
    create(zk, zk_root)
    before = snapshot(zk, zk_root)
    held = admin.read_assignment(zk, zk_root)[0].storages["s0:9000"]
    admin.assign_partitions(zk, zk_root, "s0:9000", set(held))
    assert snapshot(zk, zk_root) == before


# --- storage and partition changes -----------------------------------------------------------


def test_add_storage_and_assign(zk, zk_root) -> None:
    create(zk, zk_root)
    a = admin.add_storage(zk, zk_root, "new:9000", group=4, partitions={0, 5})
    assert a.storages["new:9000"] == frozenset({0, 5})
    assert a.groups["new:9000"] == 4
    a = admin.assign_partitions(zk, zk_root, "new:9000", {1, 2})
    assert a.storages["new:9000"] == frozenset({0, 1, 2, 5})
    assert admin.read_assignment(zk, zk_root)[0] == a
    a = admin.unassign_partitions(zk, zk_root, "new:9000", {0, 1, 2, 5})
    assert a.storages["new:9000"] == frozenset()
    a = admin.remove_storage(zk, zk_root, "new:9000")
    assert "new:9000" not in a.storages and "new:9000" not in a.groups
    assert admin.read_assignment(zk, zk_root)[0] == create(zk, zk_root).assignment


def test_set_storage_groups_changes_only_the_groups(zk, zk_root) -> None:
    before = create(zk, zk_root).assignment
    a = admin.set_storage_groups(zk, zk_root, {"s0:9000": 2, "s1:9000": 1})
    assert a.storages == before.storages
    assert (a.groups["s0:9000"], a.groups["s1:9000"]) == (2, 1)
    assert admin.read_assignment(zk, zk_root)[0] == a
    with pytest.raises(ClusterError, match="not in the cluster: gone:1"):
        admin.set_storage_groups(zk, zk_root, {"gone:1": 1})
    with pytest.raises(ClusterError, match="a group is a number from 0: s0:9000"):
        admin.set_storage_groups(zk, zk_root, {"s0:9000": -1})
    assert admin.read_assignment(zk, zk_root)[0] == a


@pytest.mark.parametrize(
    ("op", "fragment"),
    [
        (lambda zk, r: admin.add_storage(zk, r, "s1:9000"), "s1:9000 is already in the cluster"),
        (lambda zk, r: admin.add_storage(zk, r, "nope"), "'nope' is not host:port"),
        (
            lambda zk, r: admin.add_storage(zk, r, "n:1", partitions={6}),
            r"partitions \[6\] are outside 0..5",
        ),
        (
            lambda zk, r: admin.assign_partitions(zk, r, "n:1", {0}),
            "n:1 is not in the cluster; add it first",
        ),
        (
            lambda zk, r: admin.assign_partitions(zk, r, "s0:9000", {2, 9, 7}),
            r"partitions \[7, 9\] are outside",
        ),
        (
            lambda zk, r: admin.unassign_partitions(zk, r, "n:1", {0}),
            "n:1 is not in the cluster",
        ),
        (
            lambda zk, r: admin.remove_storage(zk, r, "n:1"),
            "n:1 is not in the cluster \\(nodes: s0:9000, s1:9000, s2:9000\\)",
        ),
    ],
    ids=[
        "add-duplicate",
        "add-bad-address",
        "add-out-of-range",
        "assign-unknown",
        "assign-out-of-range",
        "unassign-unknown",
        "remove-unknown",
    ],
)
def test_refused_changes_write_nothing(zk, zk_root, op, fragment) -> None:
    create(zk, zk_root)
    before = snapshot(zk, zk_root)
    with pytest.raises(ClusterError, match=fragment):
        op(zk, zk_root)
    assert snapshot(zk, zk_root) == before


def test_remove_storage_refused_below_the_replica_count(zk, zk_root) -> None:
    # 3 partitions x 2 replicas on 3 storages: each holds two partitions
    create(zk, zk_root, num_partitions=3)
    held = admin.read_assignment(zk, zk_root)[0].storages["s0:9000"]
    assert len(held) == 2
    before = snapshot(zk, zk_root)
    with pytest.raises(ClusterError) as info:
        admin.remove_storage(zk, zk_root, "s0:9000")
    message = str(info.value)
    assert "refusing to remove s0:9000" in message
    assert f"partitions {format_partition_ranges(held)} would have fewer than 2" in message
    assert snapshot(zk, zk_root) == before
    # after moving its replicas elsewhere it may go
    admin.add_storage(zk, zk_root, "s3:9000", partitions=set(held))
    a = admin.remove_storage(zk, zk_root, "s0:9000")
    assert set(a.storages) == {"s1:9000", "s2:9000", "s3:9000"}
    assert a.problems(3, 2) == []


def test_unassign_refused_below_the_replica_count(zk, zk_root) -> None:
    create(zk, zk_root, num_partitions=12)
    held = sorted(admin.read_assignment(zk, zk_root)[0].storages["s1:9000"])
    before = snapshot(zk, zk_root)
    with pytest.raises(ClusterError) as info:
        admin.unassign_partitions(zk, zk_root, "s1:9000", set(held))
    message = str(info.value)
    assert "refusing to unassign those partitions from s1:9000" in message
    assert f"partitions {format_partition_ranges(held)} would have fewer than 2" in message
    assert snapshot(zk, zk_root) == before
    # unassigning a partition that has a spare replica is fine
    admin.add_storage(zk, zk_root, "s3:9000", partitions={held[0]})
    a = admin.unassign_partitions(zk, zk_root, "s1:9000", {held[0]})
    assert held[0] not in a.storages["s1:9000"]
    assert len(a.replicas_of(held[0])) == 2
    assert a.problems(12, 2) == []


def _writing_session(zk, root, partition, members, others=()) -> None:
    """Record a writing session 7 of ``members`` (and earlier-session ``others``)."""
    states = {a: ReplicaState(7, UNRESOLVED) for a in members}
    states.update({a: ReplicaState(6, 10) for a in others})
    zk.set(ClusterPaths.of(root).partition(partition), PartitionMetadata(1, 7, states).encode())


def test_removing_members_the_last_writing_session_needs_is_refused(zk, zk_root) -> None:
    # The example: {s0, s1, s2} grew to {s0, s1, s2, s3}, and a session ran over
    # the four before s3 joined. Removing s0 would leave 2 of 4: the vote could wait for
    # ever. Once s3 is a member, it may go.
    create(zk, zk_root, num_partitions=1, num_replicas=3)
    admin.add_storage(zk, zk_root, "s3:9000", partitions={0})
    _writing_session(zk, zk_root, 0, ["s0:9000", "s1:9000", "s2:9000"], others=["s3:9000"])
    before = snapshot(zk, zk_root)
    for op in (
        lambda: admin.unassign_partitions(zk, zk_root, "s0:9000", {0}),
        lambda: admin.remove_storage(zk, zk_root, "s0:9000"),
    ):
        with pytest.raises(ClusterError) as info:
            op()
        message = str(info.value)
        assert "partition 0: its last writing session (session 7)" in message
        assert "only 2 of its members would remain after removing s0:9000" in message
        assert "recovery needs 3" in message
        assert snapshot(zk, zk_root) == before
    _writing_session(zk, zk_root, 0, ["s0:9000", "s1:9000", "s2:9000", "s3:9000"])
    a = admin.remove_storage(zk, zk_root, "s0:9000")
    assert a.replicas_of(0) == ["s1:9000", "s2:9000", "s3:9000"]


def test_a_session_recorded_during_a_replica_change_makes_it_decide_again(
    zk, clients, zk_root, monkeypatch
) -> None:
    # The metadata read and the assignment write are one transaction: a server recording
    # a new session in between (here: s3 not yet a member) is seen, and the change refused.
    create(zk, zk_root, num_partitions=1, num_replicas=3)
    admin.add_storage(zk, zk_root, "s3:9000", partitions={0})
    _writing_session(zk, zk_root, 0, ["s0:9000", "s1:9000", "s2:9000", "s3:9000"])
    server = clients()
    transaction, began = zk.transaction, []

    def racing_transaction():  # the server writes just after our checks read
        if not began:
            _writing_session(server, zk_root, 0, ["s0:9000", "s1:9000", "s2:9000"], ["s3:9000"])
        began.append(True)
        return transaction()

    monkeypatch.setattr(zk, "transaction", racing_transaction)
    with pytest.raises(ClusterError, match="only 2 of its members would remain"):
        admin.unassign_partitions(zk, zk_root, "s0:9000", {0})
    assert len(began) == 1  # the first attempt's transaction failed; the second refused
    assert "s0:9000" in admin.read_assignment(zk, zk_root)[0].replicas_of(0)


# --- reading --------------------------------------------------------------------------------


def test_read_cluster(zk, clients, zk_root) -> None:
    created = create(zk, zk_root)
    paths = ClusterPaths.of(zk_root)
    meta = PartitionMetadata(3, 12, {"s0:9000": ReplicaState(12, -1)})
    zk.set(paths.partition(1), meta.encode())
    zk.set(paths.ownership, Ownership({p: ("srv-0", p) for p in range(6)}).encode())
    server = clients()
    reg = ServerRegistration("srv-0", "10.0.0.5", 9100, 9101)
    server.create(paths.server("srv-0"), reg.encode(), ephemeral=True)
    st = admin.read_cluster(zk, zk_root)
    assert st.root == zk_root
    assert st.params == created.params
    assert st.assignment == created.assignment
    assert st.partitions[1] == meta
    assert st.partitions[0] == PartitionMetadata()
    assert st.servers == {"srv-0": reg}
    assert st.ownership.partitions[4] == ("srv-0", 4)
    assert st.problems == []


def test_read_cluster_reports_problems(zk, zk_root) -> None:
    create(zk, zk_root)
    paths = ClusterPaths.of(zk_root)
    zk.set(paths.partition(0), b"garbage")
    zk.delete(paths.partition(4))
    zk.create(paths.server("bad"), b'{"kind":"server","version":1}', ephemeral=True)
    st = admin.read_cluster(zk, zk_root)
    assert any(p.startswith(f"{paths.partition(0)}: partition: not a JSON") for p in st.problems)
    assert "partition 4 has no metadata node" in st.problems
    assert any(paths.server("bad") in p and "'server_id'" in p for p in st.problems)
    assert sorted(st.partitions) == [1, 2, 3, 5]


def test_read_params_errors(zk, zk_root) -> None:
    with pytest.raises(ClusterError, match=f"no Waltz cluster at {zk_root}"):
        admin.read_params(zk, zk_root)
    zk.create(f"{zk_root}/cluster", b'{"kind":"cluster","version":2}', makepath=True)
    with pytest.raises(ClusterError, match=f"{zk_root}/cluster: cluster: codec version 2"):
        admin.read_params(zk, zk_root)


def test_assignment_changes_refused_on_incomplete_cluster(zk, zk_root) -> None:
    create(zk, zk_root)
    zk.delete(ClusterPaths.of(zk_root).assignment)
    with pytest.raises(ClusterError, match="assignment is missing"):
        admin.add_storage(zk, zk_root, "n:1")


# --- servers, sessions and delete -----------------------------------------------------------


def register(client: KazooClient, root: str, server_id: str = "srv-0") -> str:
    reg = ServerRegistration(server_id, "127.0.0.1", 9100, 9101)
    return client.create(ClusterPaths.of(root).server(server_id), reg.encode(), ephemeral=True)


def test_ephemeral_registration_vanishes_when_its_session_closes(zk, zookeeper, zk_root) -> None:
    create(zk, zk_root)
    server = connect(zookeeper.connect_string, timeout=10.0)
    try:
        path = register(server, zk_root)
        assert zk.exists(path).ephemeralOwner == server.client_id[0]
        assert list(admin.read_cluster(zk, zk_root).servers) == ["srv-0"]
    finally:
        server.stop()
        server.close()
    assert wait_until(lambda: zk.exists(path) is None)
    assert admin.read_cluster(zk, zk_root).servers == {}


def test_ephemeral_registration_vanishes_when_its_session_expires(zk, zookeeper, zk_root) -> None:
    """The server's process does not close its session; the session is expired under it
    (by closing it from a second connection that borrows its session ID and password)."""
    create(zk, zk_root)
    server = connect(zookeeper.connect_string, timeout=10.0)
    lost = threading.Event()
    server.add_listener(lambda state: lost.set() if state == "LOST" else None)
    try:
        path = register(server, zk_root)
        assert zk.exists(path) is not None
        session_id, password = server.client_id
        thief = KazooClient(hosts=zookeeper.connect_string, client_id=(session_id, password))
        thief.start(timeout=10.0)
        thief.stop()  # closes the shared session: for `server` it has expired
        thief.close()
        assert wait_until(lambda: zk.exists(path) is None)
        assert lost.wait(10.0), "the registering client never saw its session expire"
    finally:
        server.stop()
        server.close()


def test_delete_refused_with_the_wrong_name(zk, zk_root) -> None:
    create(zk, zk_root)
    before = snapshot(zk, zk_root)
    with pytest.raises(ClusterError) as info:
        admin.delete_cluster(zk, zk_root, "Prod")
    assert "is named 'prod'" in str(info.value)
    assert snapshot(zk, zk_root) == before


def test_delete_of_a_missing_cluster_is_refused(zk, zk_root) -> None:
    with pytest.raises(ClusterError, match="no Waltz cluster"):
        admin.delete_cluster(zk, zk_root, "prod")


def test_delete_refused_while_a_server_is_registered(zk, zookeeper, zk_root) -> None:
    create(zk, zk_root)
    server = connect(zookeeper.connect_string, timeout=10.0)
    try:
        register(server, zk_root, "srv-1")
        register(server, zk_root, "srv-0")
        before = snapshot(zk, zk_root)
        with pytest.raises(ClusterError) as info:
            admin.delete_cluster(zk, zk_root, "prod")
        assert "servers srv-0, srv-1 are still registered" in str(info.value)
        assert snapshot(zk, zk_root) == before
    finally:
        close(server)
    # the registering session closed: now it may go
    assert wait_until(lambda: zk.get_children(ClusterPaths.of(zk_root).servers) == [])
    admin.delete_cluster(zk, zk_root, "prod")
    assert zk.exists(zk_root) is None


def test_delete_with_force_while_a_server_is_registered(zk, clients, zk_root) -> None:
    create(zk, f"{zk_root}/a")
    create(zk, f"{zk_root}/b")
    server = clients()
    register(server, f"{zk_root}/a")
    admin.new_client_id(zk, f"{zk_root}/a")
    admin.delete_cluster(zk, f"{zk_root}/a", "prod", force=True)
    assert zk.exists(f"{zk_root}/a") is None
    assert admin.read_params(zk, f"{zk_root}/b").name == "prod"  # the neighbour is untouched
    # and the root can be created afresh
    assert create(zk, f"{zk_root}/a").created


# --- client IDs -----------------------------------------------------------------------------


def test_client_ids_unique_and_increasing(zk, clients, zk_root) -> None:
    create(zk, zk_root)
    other = clients()
    ids = []
    for i in range(10):
        ids.append(admin.new_client_id(zk if i % 2 else other, zk_root))
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    assert all(isinstance(i, int) and i >= 0 for i in ids)
    assert zk.get_children(ClusterPaths.of(zk_root).client_ids) == []  # nothing left behind


def test_client_ids_unique_under_concurrency(zk, clients, zk_root) -> None:
    create(zk, zk_root)
    n, each = 6, 15
    workers = [clients() for _ in range(n)]
    barrier = threading.Barrier(n)

    def body(i: int) -> list[int]:
        barrier.wait()
        got = [admin.new_client_id(workers[i], zk_root) for _ in range(each)]
        assert got == sorted(got) and len(set(got)) == each  # increasing per client
        return got

    results = run_threads(n, body)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors
    all_ids = [i for r in results for i in r]
    assert len(set(all_ids)) == n * each
    assert admin.new_client_id(zk, zk_root) > max(all_ids)


def test_client_ids_are_per_cluster(zk, zk_root) -> None:
    create(zk, f"{zk_root}/a")
    create(zk, f"{zk_root}/b")
    a = [admin.new_client_id(zk, f"{zk_root}/a") for _ in range(3)]
    b = admin.new_client_id(zk, f"{zk_root}/b")
    assert a == sorted(set(a))
    assert b <= a[0]  # an independent counter, starting afresh
