"""The reconcile's pipeline (pipeline.py): named steps in their declared order over one
state; a step that stops the pipeline stops the rest, and the reconciler reports why
(reconcile.py) as it reports any reconcile that cannot go on."""

from __future__ import annotations

import datetime
from dataclasses import replace

import pytest

from waltz_operator.events import Event
from waltz_operator.kube import Connection, KubeApi
from waltz_operator.metrics import OperatorMetrics
from waltz_operator.pipeline import Step, Stop, run_pipeline
from waltz_operator.reconcile import WARNING_REPEAT, Reconciler
from waltz_operator.reconciliation import Reconciliation


def appending(name: str):
    def step(state: tuple[str, ...]) -> tuple[str, ...]:
        return (*state, name)

    return step


def appending_later(name: str):
    async def step(state: tuple[str, ...]) -> tuple[str, ...]:
        return (*state, name)

    return step


@pytest.mark.asyncio
async def test_the_steps_run_in_their_declared_order_sync_or_async():
    steps = [
        Step("first", appending("first")),
        Step("second", appending_later("second")),
        Step("third", appending("third")),
    ]
    finished = await run_pipeline(steps, ())
    assert finished.state == ("first", "second", "third")
    assert finished.ran == ("first", "second", "third")
    assert finished.stop is None


@pytest.mark.asyncio
async def test_a_guard_sees_the_state_the_steps_before_it_left():
    steps = [
        Step("skipped", appending("skipped"), lambda s: "first" in s),
        Step("first", appending("first")),
        Step("after-first", appending("after-first"), lambda s: "first" in s),
        Step("never", appending("never"), lambda s: "nothing" in s),
    ]
    finished = await run_pipeline(steps, ())
    assert finished.state == ("first", "after-first")
    assert finished.ran == ("first", "after-first")


@pytest.mark.asyncio
async def test_a_stopping_step_stops_the_rest():
    async def refuse(state: tuple[str, ...]) -> Stop:
        return Stop("TlsModeRefused", "no")

    steps = [
        Step("first", appending("first")),
        Step("refuse", refuse),
        Step("later", appending("later")),
    ]
    finished = await run_pipeline(steps, ())
    assert finished.stop == Stop("TlsModeRefused", "no")
    assert finished.ran == ("first", "refuse")
    assert finished.state == ("first",)  # as the steps before the stop left it


@pytest.mark.asyncio
async def test_a_step_skipped_by_its_guard_cannot_stop_the_pipeline():
    steps = [
        Step("refuse", lambda s: Stop("Refused", "no"), lambda s: False),
        Step("only", appending("only")),
    ]
    finished = await run_pipeline(steps, ())
    assert (finished.state, finished.ran, finished.stop) == (("only",), ("only",), None)


# --- the reconciler reports a stop -------------------------------------------------------


BODY = {
    "apiVersion": "waltz.io/v1alpha1",
    "kind": "WaltzCluster",
    "metadata": {"name": "demo", "namespace": "prod", "uid": "u1", "generation": 4},
    "spec": {"zookeeper": {"connect": "zk:2181"}},
}
T0 = datetime.datetime(2026, 11, 23, 10, 0, tzinfo=datetime.UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime.datetime:
        return self.now


def conditions(status: dict) -> dict[str, dict]:
    return {c["type"]: c for c in status["conditions"]}


@pytest.mark.asyncio
async def test_a_stop_ends_in_the_status_and_a_warning_repeated_only_after_a_while():
    ran: list[str] = []

    def record(name: str):
        def step(state: Reconciliation) -> Reconciliation:
            ran.append(name)
            return state

        return step

    def refuse(state: Reconciliation) -> Stop:
        ran.append("refuse")
        return Stop("TlsModeRefused", "the mode cannot change")

    clock = Clock()
    kube = KubeApi(Connection(server="http://127.0.0.1:9"))  # never called
    try:
        reconciler = Reconciler(
            kube,
            OperatorMetrics(),
            clock=clock,
            pipeline=[
                Step("observe", record("observe")),
                Step("refuse", refuse),
                Step("apply", record("apply")),
            ],
        )
        first = await reconciler.reconcile(BODY, {})
        assert ran == ["observe", "refuse"]
        degraded = conditions(first.status)["Degraded"]
        assert (degraded["status"], degraded["reason"], degraded["message"]) == (
            "True",
            "TlsModeRefused",
            "the mode cannot change",
        )
        assert degraded["observedGeneration"] == 4
        assert conditions(first.status)["Progressing"]["status"] == "False"
        assert [(e.type, e.reason) for e in first.events] == [("Warning", "TlsModeRefused")]
        assert first.status_changed and not first.failed and not first.busy

        again = await reconciler.reconcile(BODY, {})  # the same failure: no new Warning
        assert again.events == [] and not again.status_changed

        clock.now = T0 + datetime.timedelta(seconds=WARNING_REPEAT)
        later = await reconciler.reconcile(BODY, {})
        assert [e.reason for e in later.events] == ["TlsModeRefused"]
    finally:
        await kube.close()


@pytest.mark.asyncio
async def test_an_invalid_spec_stops_before_any_step_and_an_exception_fails_the_reconcile():
    def explode(state: Reconciliation) -> Reconciliation:
        raise RuntimeError("the API server went away")

    kube = KubeApi(Connection(server="http://127.0.0.1:9"))
    try:
        reconciler = Reconciler(
            kube, OperatorMetrics(), clock=Clock(), pipeline=[Step("explode", explode)]
        )
        bad = {**BODY, "spec": {"zookeeper": {"connect": "zk:2181"}, "partitions": "four"}}
        invalid = await reconciler.reconcile(bad, {})
        assert conditions(invalid.status)["Degraded"]["reason"] == "InvalidSpec"
        assert not invalid.failed

        failed = await reconciler.reconcile(BODY, {})
        degraded = conditions(failed.status)["Degraded"]
        assert degraded["reason"] == "ReconcileFailed"
        assert "the API server went away" in degraded["message"]
        assert failed.failed
    finally:
        await kube.close()


@pytest.mark.asyncio
async def test_a_finished_pipeline_reports_its_status_events_and_progress():
    def report(state: Reconciliation) -> Reconciliation:
        status = {"observedGeneration": state.generation, "conditions": []}
        told = state.told(
            Event("Normal", "Done", "it ran"),
            Event("Warning", "Refused", "x"),
            Event("Warning", "StorageVolumeLost", "no refusal: not counted as one"),
        )
        return replace(told, status=status, progress="rolling storage: restarted demo-0")

    kube = KubeApi(Connection(server="http://127.0.0.1:9"))
    try:
        metrics = OperatorMetrics()
        reconciler = Reconciler(kube, metrics, clock=Clock(), pipeline=[Step("report", report)])
        outcome = await reconciler.reconcile(BODY, {})
        assert outcome.status == {"observedGeneration": 4, "conditions": []}
        assert [e.reason for e in outcome.events] == ["Done", "Refused", "StorageVolumeLost"]
        assert outcome.busy and outcome.status_changed and not outcome.failed
        assert reconciler.statuses["prod/demo"] == outcome.status
        refusals = metrics.registry.get_sample_value(
            "waltz_operator_refusals_total", {"cluster": "prod/demo"}
        )
        assert refusals == 1
        # The same status again: nothing to write.
        assert not (await reconciler.reconcile(BODY, {})).status_changed
    finally:
        await kube.close()
