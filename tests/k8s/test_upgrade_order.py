"""The order of an upgrade (upgrade_order.py, and its place in the reconcile:
reconcile_decisions.py): on an image change the server Deployment keeps the image its
servers run until every storage pod runs the new storage image, ready, on the
StatefulSet's revision; everything else of it applies at once. Pure: the same inputs
give the same Deployment, so an operator restarted half-way decides as before."""

from __future__ import annotations

import copy
import datetime
from dataclasses import replace
from typing import Any

import pytest

from waltz_operator.desired import CONFIG_HASH, server_objects
from waltz_operator.events import Event
from waltz_operator.pipeline import Step, run_pipeline
from waltz_operator.reconcile_decisions import (
    may_roll,
    reported,
    servers_applied,
    servers_planned,
    storage_pods_running,
)
from waltz_operator.reconcile_settings import ReconcileSettings
from waltz_operator.reconcile_steps import ReconcileSteps
from waltz_operator.reconciliation import Reconciliation, begin
from waltz_operator.upgrade_order import (
    ServerDeployment,
    StoragePod,
    container_image,
    image_changing,
    servers_to_apply,
    storage_behind,
    with_container_image,
)

NOW = "2026-11-30T10:00:00Z"
OLD, NEW = "0.1.0", "0.2.0"
REGISTRY = "ghcr.io/waltz-io"
REV = "demo-storage-6f7b9c"


def body(tag: str = NEW, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "waltz.io/v1alpha1",
        "kind": "WaltzCluster",
        "metadata": {"name": "demo", "namespace": "prod", "uid": "u1", "generation": 2},
        "spec": {"zookeeper": {"connect": "zk:2181"}, "image": {"tag": tag}, **spec},
    }


def started(tag: str = NEW, **changes: Any) -> Reconciliation:
    state = begin(body(tag), {}, {}, NOW, ())
    assert isinstance(state, Reconciliation)
    return replace(state, **changes)


def deployment(tag: str, **spec: Any) -> dict[str, Any]:
    """The server Deployment a cluster at this tag wants."""
    state = begin(body(tag, **spec), {}, {}, NOW, ())
    assert isinstance(state, Reconciliation)
    return copy.deepcopy(next(o for o in server_objects(state.spec) if o["kind"] == "Deployment"))


def server(tag: str) -> str:
    return f"{REGISTRY}/waltz-server:{tag}"


def storage(tag: str) -> str:
    return f"{REGISTRY}/waltz-storage:{tag}"


def pods(*tags: str | None, ready: bool = True, revision: str = REV) -> list[StoragePod]:
    """Storage pods 0..n-1 running these tags (None: being replaced)."""
    return [
        StoragePod(f"demo-storage-{i}", storage(t), revision, ready)
        if t is not None
        else StoragePod(f"demo-storage-{i}", None, None, False)
        for i, t in enumerate(tags)
    ]


# --- the rule --------------------------------------------------------------------------------


def test_a_cluster_being_created_gets_the_wanted_image_at_once():
    desired = deployment(NEW)
    plan = servers_to_apply(desired, None, storage(NEW), None, [])
    assert plan == ServerDeployment(desired)
    # Nothing there is upgraded either: no Deployment, no storage pods yet.
    assert servers_to_apply(desired, None, storage(NEW), REV, pods(OLD, None)) == plan


def test_a_change_that_is_not_an_image_change_is_not_held():
    """Settings and replicas reach the servers while the storage pods are anywhere."""
    live = deployment(OLD)
    desired = deployment(OLD, server={"replicas": 3, "settings": {"log_level": "debug"}})
    assert not image_changing(desired, live)
    for behind in (pods(OLD, OLD, OLD, ready=False), pods(None, None, None), []):
        assert servers_to_apply(desired, live, storage(OLD), REV, behind) == ServerDeployment(
            desired
        )


def test_on_an_image_change_the_servers_keep_theirs_while_no_storage_pod_runs_the_new_one():
    live = deployment(OLD)
    desired = deployment(NEW, server={"replicas": 3, "settings": {"log_level": "debug"}})
    assert image_changing(desired, live)
    plan = servers_to_apply(desired, live, storage(NEW), REV, pods(OLD, OLD, OLD))
    assert plan.released is None
    assert container_image(plan.obj, "server") == server(OLD)
    # Everything else of the desired Deployment applies: replicas, settings (its hash).
    assert plan.obj["spec"]["replicas"] == 3
    annotations = plan.obj["spec"]["template"]["metadata"]["annotations"]
    assert (
        annotations[CONFIG_HASH]
        == desired["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH]
    )
    assert plan.obj == with_container_image(desired, "server", server(OLD))
    assert container_image(desired, "server") == server(NEW)  # the desired one is untouched
    assert plan.held is not None
    assert plan.held.startswith(
        f"upgrading: servers wait for the storage nodes to run {storage(NEW)} (0/3 do; "
    )
    assert f"demo-storage-0 runs {storage(OLD)}" in plan.held
    assert f"the servers keep {server(OLD)}" in plan.held


@pytest.mark.parametrize(
    ("behind", "says"),
    [
        (pods(NEW, NEW, OLD), f"demo-storage-2 runs {storage(OLD)}"),
        (pods(NEW, None, NEW), "demo-storage-1 is being replaced"),
        (
            [*pods(NEW, NEW), StoragePod("demo-storage-2", storage(NEW), REV, ready=False)],
            "demo-storage-2 is not ready",
        ),
        (
            [*pods(NEW, NEW), StoragePod("demo-storage-2", storage(NEW), "demo-storage-1", True)],
            f"demo-storage-2 is not on the StatefulSet's revision {REV}",
        ),
    ],
    ids=["old-image", "being-replaced", "never-ready", "old-revision"],
)
def test_the_servers_wait_for_the_last_storage_pod(behind, says):
    """Part of the way through the storage roll: still held, and the message names the
    pod it waits for (a pod that never becomes ready holds the servers for good, and the
    status keeps saying so)."""
    plan = servers_to_apply(deployment(NEW), deployment(OLD), storage(NEW), REV, behind)
    assert container_image(plan.obj, "server") == server(OLD) and plan.released is None
    assert plan.held is not None and "(2/3 do; " in plan.held and says in plan.held
    assert storage_behind(storage(NEW), REV, behind) == [says]


def test_no_revision_reported_yet_holds_the_servers():
    plan = servers_to_apply(deployment(NEW), deployment(OLD), storage(NEW), None, pods(NEW, NEW))
    assert plan.held is not None and "reports no revision yet" in plan.held
    assert container_image(plan.obj, "server") == server(OLD)


def test_once_every_storage_pod_runs_the_new_image_ready_the_servers_are_released():
    desired = deployment(NEW)
    plan = servers_to_apply(desired, deployment(OLD), storage(NEW), REV, pods(NEW, NEW, NEW))
    assert plan == ServerDeployment(desired, released=server(NEW))


def test_a_downgrade_goes_in_the_same_order():
    """The rule is about images differing, not versions."""
    live, desired = deployment(NEW), deployment(OLD)
    held = servers_to_apply(desired, live, storage(OLD), REV, pods(OLD, NEW, NEW))
    assert container_image(held.obj, "server") == server(NEW)
    assert held.held is not None and f"to run {storage(OLD)}" in held.held
    done = servers_to_apply(desired, live, storage(OLD), REV, pods(OLD, OLD, OLD))
    assert done == ServerDeployment(desired, released=server(OLD))


def test_servers_released_stay_released_whatever_the_storage_pods_do_later():
    """The decision reads the live Deployment, not a memory of the upgrade: once it runs
    the new image (released before an operator restart, say), a storage pod that restarts
    afterwards holds nothing back to the old image."""
    desired = deployment(NEW)
    later = pods(NEW, None, NEW)
    assert servers_to_apply(desired, desired, storage(NEW), REV, later) == ServerDeployment(desired)


def test_a_new_upgrade_half_way_through_an_old_one_holds_the_running_image():
    """0.1.0 -> 0.2.0 under way, then 0.3.0 asked: the servers keep what they run (0.1.0)
    until every storage pod runs 0.3.0."""
    plan = servers_to_apply(
        deployment("0.3.0"), deployment(OLD), storage("0.3.0"), REV, pods(NEW, NEW, NEW)
    )
    assert container_image(plan.obj, "server") == server(OLD) and plan.released is None


def test_container_images_of_workloads_and_pods():
    desired = deployment(NEW)
    assert container_image(desired, "server") == server(NEW)
    assert container_image(desired, "storage") is None
    assert container_image(None, "server") is None
    pod = {"spec": {"containers": [{"name": "storage", "image": "s:1"}, {"name": "x"}]}}
    assert container_image(pod, "storage") == "s:1" and container_image(pod, "x") is None
    assert not image_changing(desired, {"spec": {"template": {"spec": {"containers": []}}}})


# --- in the reconcile ------------------------------------------------------------------------


def raw_pod(number: int, tag: str, revision: str = REV, ready: bool = True, **meta: Any) -> dict:
    return {
        "metadata": {
            "name": f"demo-storage-{number}",
            "labels": {"controller-revision-hash": revision},
            **meta,
        },
        "spec": {"containers": [{"name": "storage", "image": storage(tag)}]},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_storage_pods_as_they_run():
    state = started()
    running = storage_pods_running(
        state.spec,
        [
            raw_pod(0, NEW),
            raw_pod(2, OLD, revision="old", ready=False),
            raw_pod(3, NEW, deletionTimestamp=NOW),
            raw_pod(7, NEW),  # beyond the count: not one the StatefulSet wants
        ],
        4,
    )
    assert running == [
        StoragePod("demo-storage-0", storage(NEW), REV, True),
        StoragePod("demo-storage-1", None, None, False),
        StoragePod("demo-storage-2", storage(OLD), "old", False),
        StoragePod("demo-storage-3", None, None, False),
    ]


def statefulset(replicas: int = 3, revision: str | None = REV) -> dict[str, Any]:
    return {"spec": {"replicas": replicas}, "status": {"updateRevision": revision}}


def test_the_plan_counts_the_statefulsets_pods_on_its_revision():
    state = started(statefulset=statefulset(3))
    live = deployment(OLD)
    three = [raw_pod(i, NEW) for i in range(3)]
    assert servers_planned(state, deployment(NEW), live, three).released == server(NEW)
    # A pod the StatefulSet has not made yet (a scale-up under way) is waited for.
    four = replace(state, statefulset=statefulset(4))
    assert servers_planned(four, deployment(NEW), live, three).held is not None
    # Without a StatefulSet (made again for a volume change): no revision, held.
    gone = replace(state, statefulset=None, current_storage=3)
    held = servers_planned(gone, deployment(NEW), live, three).held
    assert held is not None and "no revision" in held


def test_held_servers_are_progress_that_the_storage_roll_does_not_wait_for():
    plan = servers_to_apply(deployment(NEW), deployment(OLD), storage(NEW), REV, pods(OLD))
    state = started(cluster_key="k-1", view=object(), statefulset=statefulset(1), current_storage=1)
    held = servers_applied(state, plan, first=True)
    assert held.servers_held == plan.held and held.events == ()
    assert held.progress is None and may_roll(held)  # the roll goes on
    rolling = held.waiting("rolling storage: restarted demo-storage-0")
    status = reported(replace(rolling, view=None)).status
    assert status is not None
    (progressing,) = [c for c in status["conditions"] if c["type"] == "Progressing"]
    assert progressing["status"] == "True" and progressing["reason"] == "InProgress"
    assert progressing["message"] == f"{plan.held}; rolling storage: restarted demo-storage-0"
    assert reported(replace(held, view=None)).progress == plan.held  # the reconcile is busy


def test_the_release_is_one_event():
    plan = ServerDeployment(deployment(NEW), released=server(NEW))
    released = servers_applied(started(), plan, first=True)
    assert released.events == (
        Event(
            "Normal",
            "UpgradingServers",
            f"storage nodes upgraded; rolling the servers to {server(NEW)}",
        ),
    )
    assert released.servers_held is None
    # Applied already by this process (the watch not showing it yet): no second Event.
    assert servers_applied(started(), plan, first=False).events == ()
    assert servers_applied(started(), ServerDeployment(deployment(NEW)), True).events == ()


# --- the step --------------------------------------------------------------------------------


class RecordingKube:
    """The API calls apply_objects makes: the live Deployment (read only while its image
    would change) and the storage pods (read only then), and what is applied."""

    def __init__(self, live: dict[str, Any] | None, pods: list[dict[str, Any]]) -> None:
        self.live, self.pods = live, pods
        self.applied: list[dict[str, Any]] = []
        self.reads: list[str] = []

    async def get(self, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        self.reads.append(f"get {kind}")
        return self.live if kind == "Deployment" else None

    async def list(self, kind: str, namespace: str | None, labels: Any = None) -> list:
        self.reads.append(f"list {kind}")
        return self.pods if kind == "Pod" else []

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.applied.append(obj)
        return obj


def applied_deployment(kube: RecordingKube) -> dict[str, Any]:
    (found,) = [o for o in kube.applied if o["kind"] == "Deployment"]
    return found


def steps_over(kube: RecordingKube) -> ReconcileSteps:
    return ReconcileSteps(kube, None, ReconcileSettings(), datetime.datetime.now)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_apply_objects_sends_the_deployment_through_the_decision():
    """(The StatefulSet found here is no one's: it is left alone, a refusal, and the
    Deployment's decision still goes by its revision.)"""
    kube = RecordingKube(deployment(OLD), [raw_pod(0, NEW), raw_pod(1, OLD), raw_pod(2, OLD)])
    steps = steps_over(kube)
    state = started(statefulset=statefulset(3), current_storage=3, live=None)
    held = await steps.apply_objects(state)
    assert container_image(applied_deployment(kube), "server") == server(OLD)
    assert held.servers_held is not None and "(1/3 do; " in held.servers_held
    assert kube.reads == ["get Deployment", "list Pod"] and held.events == ()

    kube.pods = [raw_pod(i, NEW) for i in range(3)]
    kube.applied.clear()
    done = await steps.apply_objects(state)
    assert container_image(applied_deployment(kube), "server") == server(NEW)
    assert done.servers_held is None
    assert [e.reason for e in done.events] == ["UpgradingServers"]


@pytest.mark.asyncio
async def test_an_idle_cluster_reads_no_pods_and_no_deployment_for_the_decision():
    desired = deployment(NEW)
    key = ("Deployment", "prod", "demo-server")
    kube = RecordingKube(desired, [])
    steps = steps_over(kube)
    state = started(live={key: desired})
    await steps.apply_objects(state)
    assert kube.reads == []
    assert container_image(applied_deployment(kube), "server") == server(NEW)


@pytest.mark.asyncio
async def test_the_step_reads_the_deployment_when_the_watch_shows_another_image():
    """The watch may not show the last apply yet: an old image there must not hold the
    servers back to it once they were released."""
    desired = deployment(NEW)
    key = ("Deployment", "prod", "demo-server")
    kube = RecordingKube(desired, [raw_pod(0, OLD, ready=False)])
    steps = steps_over(kube)
    state = started(live={key: deployment(OLD)}, statefulset=None, current_storage=1)
    after = await steps.apply_objects(state)
    assert kube.reads == ["get Deployment"]
    assert after.servers_held is None and after.events == ()
    assert container_image(applied_deployment(kube), "server") == server(NEW)


@pytest.mark.asyncio
async def test_apply_objects_runs_only_when_changes_may_be_applied():
    steps = steps_over(RecordingKube(None, []))
    dry = [Step(s.name, lambda given: given, s.when) for s in steps.pipeline()]
    doc = body()
    doc["metadata"]["annotations"] = {"waltz.io/paused": "true"}
    paused = begin(doc, {}, {}, NOW, ())
    assert isinstance(paused, Reconciliation)
    assert "apply-objects" not in (await run_pipeline(dry, paused)).ran
    assert "apply-objects" in (await run_pipeline(dry, started())).ran
