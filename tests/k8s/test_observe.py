"""The operator's quorum view, without daemons: a server's /metrics (as the real server's
collector writes it) parsed, joined with ZooKeeper's metadata, and exported again as the
operator's own metrics."""

from __future__ import annotations

import uuid
from types import SimpleNamespace

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from waltz_client.cluster.admin import ClusterState
from waltz_client.cluster.metadata import (
    UNRESOLVED,
    ClusterParams,
    Ownership,
    PartitionMetadata,
    ReplicaAssignment,
    ReplicaState,
    ServerRegistration,
    key_fingerprint,
)
from waltz_operator.metrics import OperatorMetrics
from waltz_operator.observe import ServerPartition, combine, parse_server_metrics
from waltz_operator.rollout import PartitionState
from waltz_server.memory_budget import PartitionBounds
from waltz_server.metrics import ServerMetrics
from waltz_server.storage_pool import StoragePool

A, B, C, D = "10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000", "10.0.0.4:7000"


def fake_partition(
    generation: int,
    hwm: int,
    positions: dict[str, tuple[bool, int | None]],
    session_id: int = 3,
) -> SimpleNamespace:
    """What ServerMetrics reads of a server's partition (waltz_server.partition)."""
    live = sum(1 for member, _ in positions.values() if member)
    return SimpleNamespace(
        session=SimpleNamespace(live_replicas=live, session_id=session_id)
        if session_id >= 0
        else None,
        high_water_mark=hwm,
        generation=generation,
        context=SimpleNamespace(replicas=sorted(positions)),
        healthy=session_id >= 0,
        queue_size=0,
        subscriptions=[object()],
        mounted_clients=1,
        data_cache=SimpleNamespace(bytes=100, hits=2, misses=1),
        feed_cache=SimpleNamespace(bytes=50),
        log_start=0,
        stats=SimpleNamespace(appended=hwm + 1, committed=hwm + 1, lock_failures=0, ignored=0),
        feed_sent=hwm + 1,
        replica_positions=lambda: dict(positions),
    )


def server_metrics_text(partitions: dict[int, SimpleNamespace]) -> str:
    """The /metrics text of a server holding these partitions, written by the server's own
    collector (with a commit histogram and a labelled counter, as a live server has)."""
    for part in partitions.values():
        part.stats.sessions = 1
    server = SimpleNamespace(
        partitions=partitions,
        config=SimpleNamespace(memory_budget_bytes=2 << 30),
        bounds=PartitionBounds(16 << 20, 64 << 20, 64 << 20),
        storage_pool=StoragePool(),
        replacement_view=None,  # not the assigner, or no replace_storage_after
    )
    metrics = ServerMetrics(server)
    for p in partitions:
        metrics.commit_seconds.labels(str(p)).observe(0.003)
    metrics.client_errors.labels("bad-frame").inc()
    metrics.connections.inc()
    return generate_latest(metrics.registry).decode()


# server-0 owns 0 (generation 5) and 1 (generation 2 in ZooKeeper, but it still reports 1:
# a deposed owner's figures); server-1 owns 2, whose store session holds A and D, and D
# is no longer assigned it.
SERVER_0 = server_metrics_text(
    {
        0: fake_partition(5, 41, {A: (True, 41), B: (True, 39), C: (False, None)}),
        1: fake_partition(1, 17, {A: (True, 17), B: (True, 17), C: (True, 17)}),
    }
)
SERVER_1 = server_metrics_text(
    {2: fake_partition(4, 8, {A: (True, 8), C: (False, 2), D: (True, 8)}, session_id=9)}
)


def cluster_state() -> ClusterState:
    return ClusterState(
        root="/waltz/demo",
        params=ClusterParams("demo", uuid.UUID(int=7), 3, 3),
        assignment=ReplicaAssignment(
            {A: frozenset({0, 1, 2}), B: frozenset({0, 1, 2}), C: frozenset({0, 1, 2})},
            {A: 0, B: 0, C: 0},
        ),
        partitions={
            0: PartitionMetadata(5, 3, {a: ReplicaState(3, UNRESOLVED) for a in (A, B, C)}),
            1: PartitionMetadata(2, 4, {a: ReplicaState(4, UNRESOLVED) for a in (A, B, C)}),
            2: PartitionMetadata(
                4,
                9,
                {
                    A: ReplicaState(9, UNRESOLVED),
                    D: ReplicaState(9, UNRESOLVED),  # removed, but held the last session
                    C: ReplicaState(8, 5),
                },
            ),
        },
        servers={
            "server-0": ServerRegistration("server-0", "10.0.1.1", 9000, 9001),
            "server-1": ServerRegistration("server-1", "10.0.1.2", 9000, 9001),
        },
        ownership=Ownership({0: ("server-0", 5), 1: ("server-0", 2), 2: ("server-1", 4)}),
    )


def test_the_real_server_metrics_parse_into_each_partitions_report():
    reports = parse_server_metrics(SERVER_0)
    assert set(reports) == {0, 1}
    assert reports[0] == ServerPartition(
        generation=5,
        session_id=3,
        high_water_mark=41,
        in_session=frozenset({A, B}),
        lag={A: 0, B: 2},  # C's position is unknown: no lag series
    )
    assert reports[1].generation == 1
    assert reports[1].in_session == frozenset({A, B, C})
    (report,) = parse_server_metrics(SERVER_1).values()
    assert (report.generation, report.session_id, report.high_water_mark) == (4, 9, 8)
    assert report.in_session == frozenset({A, D})
    assert report.lag == {A: 0, C: 6, D: 0}  # C is catching up: copied through 2 of 8


def test_a_recovering_partition_reports_no_session():
    text = server_metrics_text({0: fake_partition(6, 41, {A: (False, None)}, session_id=-1)})
    report = parse_server_metrics(text)[0]
    assert (report.generation, report.session_id, report.in_session) == (6, -1, frozenset())


def test_metrics_without_partitions_report_nothing():
    assert parse_server_metrics(server_metrics_text({})) == {}
    assert parse_server_metrics("") == {}


@pytest.mark.parametrize(
    "text",
    [
        "<html><body>502 Bad Gateway</body></html>",
        "waltz_server_partition_generation{partition=0 5\n",
        'waltz_server_partition_generation{partition="zero"} 5\n',
        'waltz_server_partition_replica_lag{partition="0",replica="a:1"} +Inf\n',
        'waltz_server_partition_generation{partition="0"} NaN\n',
        'waltz_server_partition_high_water_mark{partition="0"} 1e400\n',
    ],
)
def test_text_that_is_not_server_metrics_is_a_value_error(text):
    with pytest.raises(ValueError):
        parse_server_metrics(text)


def test_combine_counts_only_the_current_owners_assigned_replicas_in_session():
    scrapes = {
        "server-0": parse_server_metrics(SERVER_0),
        "server-1": parse_server_metrics(SERVER_1),
    }
    view = combine(
        cluster_state(),
        scrapes,
        storage_up={A: True, B: True, C: False},
        scrape_errors={"server-2": "http://10.0.1.3:9001/metrics: timed out"},
    )
    assert (view.root, view.name, view.key) == (
        "/waltz/demo",
        "demo",
        key_fingerprint(uuid.UUID(int=7)),
    )
    p0, p1, p2 = view.partitions

    # 2 of 3 in the session: a quorum.
    assert p0.owner == "server-0" and p0.generation == 5
    assert p0.live == frozenset({A, B}) and p0.quorum and p0.high_water_mark == 41
    # The owner's generation is not ZooKeeper's: its report does not count, however good.
    assert p1.reported is None and p1.live == frozenset()
    assert not p1.quorum and p1.high_water_mark == -1
    # A and D are in the session, but D is not assigned: 1 of 3, no quorum.
    assert p2.live == frozenset({A, D}) and not p2.quorum
    assert p2.writing_members == frozenset({A, D})

    assert view.storage_up == {A: True, B: True, C: False}
    assert view.servers == {"server-0": "10.0.1.1:9001", "server-1": "10.0.1.2:9001"}
    assert view.still_serving == {D: [2]}  # D holds the last writing session's data
    assert view.problems == ("server server-2: http://10.0.1.3:9001/metrics: timed out",)

    observed = {o.partition: o for o in view.status_partitions()}
    assert [(o.live_replicas, o.assigned_replicas, o.quorum) for o in observed.values()] == [
        (2, 3, True),
        (0, 3, False),
        (1, 3, False),
    ]
    assert [o.high_water_mark for o in observed.values()] == [41, -1, 8]
    assert view.rollout_states() == {
        0: PartitionState(frozenset({A, B, C}), frozenset({A, B})),
        1: PartitionState(frozenset({A, B, C}), frozenset()),
        2: PartitionState(frozenset({A, B, C}), frozenset({A, D})),
    }


def test_a_partition_whose_owner_was_not_scraped_has_no_quorum():
    state = cluster_state()
    view = combine(state, {"server-1": parse_server_metrics(SERVER_1)})  # server-0 is down
    assert [p.quorum for p in view.partitions] == [False, False, False]
    assert view.partitions[0].reported is None
    # Nobody owns it (yet): nothing to report, nothing to count.
    state.ownership = Ownership({0: (None, 0), 1: ("server-0", 2), 2: ("server-1", 4)})
    full = {"server-0": parse_server_metrics(SERVER_0)}
    unowned = combine(state, full).partitions[0]
    assert unowned.owner is None and unowned.reported is None and not unowned.quorum


def test_a_majority_of_the_assignment_is_needed():
    state = cluster_state()
    for live, quorum in (({A, B, C}, True), ({A, C}, True), ({B}, False), (set(), False)):
        report = ServerPartition(generation=5, in_session=frozenset(live))
        (p0, *_) = combine(state, {"server-0": {0: report}}).partitions
        assert p0.quorum is quorum, live


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def series(text: str, name: str, **labels: str) -> float | None:
    return samples(text).get((name, tuple(sorted(labels.items()))))


def test_the_operator_exports_each_clusters_quorum_and_forgets_a_deleted_cluster():
    metrics = OperatorMetrics()
    view = combine(
        cluster_state(),
        {"server-0": parse_server_metrics(SERVER_0), "server-1": parse_server_metrics(SERVER_1)},
        storage_up={A: True, B: True, C: False},
    )
    demo = metrics.figures("prod/demo")
    demo.view = view
    demo.zookeeper_reachable = True
    demo.storage_ready, demo.storage_desired = 2, 3
    demo.server_ready, demo.server_desired = 2, 2
    other = metrics.figures("test/other")  # ZooKeeper not reached: no view
    assert metrics.figures("prod/demo") is demo
    metrics.reconciles.labels("prod/demo").inc()
    metrics.reconciles.labels("test/other").inc()
    metrics.refusals.labels("prod/demo").inc()
    with metrics.reconcile_seconds.labels("prod/demo").time():
        pass

    text = generate_latest(metrics.registry).decode()
    d = {"cluster": "prod/demo"}
    assert 'waltz_operator_partition_quorum{cluster="prod/demo",partition="0"} 1.0' in text
    for p, (quorum, live, hwm) in enumerate([(1, 2, 41), (0, 0, -1), (0, 1, 8)]):
        assert series(text, "waltz_operator_partition_quorum", **d, partition=str(p)) == quorum
        assert series(text, "waltz_operator_partition_replicas_live", **d, partition=str(p)) == live
        assert (
            series(text, "waltz_operator_partition_replicas_assigned", **d, partition=str(p)) == 3
        )
        assert (
            series(text, "waltz_operator_partition_high_water_mark", **d, partition=str(p)) == hwm
        )
    assert series(text, "waltz_operator_partition_generation", **d, partition="1") == 2
    assert series(text, "waltz_operator_partition_store_session_id", **d, partition="2") == 9
    assert series(text, "waltz_operator_partition_store_session_id", **d, partition="1") == -1
    owner = "waltz_operator_partition_owner_info"
    assert series(text, owner, **d, partition="2", owner="server-1") == 1
    lag = "waltz_operator_replica_lag_transactions"
    assert series(text, lag, **d, partition="0", replica=B) == 2
    assert series(text, lag, **d, partition="2", replica=C) == 6
    assert series(text, "waltz_operator_storage_node_up", **d, node=A) == 1
    assert series(text, "waltz_operator_storage_node_up", **d, node=C) == 0
    assert series(text, "waltz_operator_zookeeper_reachable", **d) == 1
    assert series(text, "waltz_operator_storage_pods_ready", **d) == 2
    assert series(text, "waltz_operator_storage_pods_desired", **d) == 3
    assert series(text, "waltz_operator_server_pods_ready", **d) == 2
    assert series(text, "waltz_operator_reconciles_total", **d) == 1
    assert series(text, "waltz_operator_refusals_total", **d) == 1
    assert series(text, "waltz_operator_reconcile_duration_seconds_count", **d) == 1
    # A cluster without a view has its ZooKeeper and pod series, no partition series.
    assert series(text, "waltz_operator_zookeeper_reachable", cluster="test/other") == 0
    assert other.view is None
    assert 'cluster="test/other",partition=' not in text

    metrics.forget("prod/demo")
    metrics.forget("never/seen")  # nothing to forget: no error
    text = generate_latest(metrics.registry).decode()
    assert 'cluster="prod/demo"' not in text
    assert series(text, "waltz_operator_zookeeper_reachable", cluster="test/other") == 0
    assert series(text, "waltz_operator_reconciles_total", cluster="test/other") == 1
