"""Leader election's rule (``decide``) and liveness from reconcile progress."""

from __future__ import annotations

from waltz_operator.health import ReconcileProgress
from waltz_operator.leader import LeaseRecord, Renew, Standby, Take, decide


def record(holder: str, transitions: int = 3, renewed: str = "t1") -> LeaseRecord:
    return LeaseRecord(holder, lease_duration=15.0, transitions=transitions, renew_time=renewed)


def test_no_lease_is_taken():
    assert decide(None, "op-a", 0.0) == Take(transitions=0)


def test_the_holder_renews():
    assert decide(record("op-a"), "op-a", 100.0) == Renew()


def test_a_live_holder_keeps_it():
    assert decide(record("op-b"), "op-a", 14.0) == Standby("op-b", 1.0)


def test_a_holder_silent_for_the_lease_duration_loses_it():
    """By the candidate's own clock: how long it has seen the very same record."""
    assert decide(record("op-b", transitions=3), "op-a", 15.0) == Take(transitions=4)


def test_a_released_lease_is_taken_at_once():
    assert decide(record(""), "op-a", 0.0) == Take(transitions=4)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_liveness_fails_only_for_a_reconcile_that_does_not_finish():
    clock = Clock()
    progress = ReconcileProgress(stall_after=300.0, clock=clock)
    assert progress.report() == (True, {"status": "ok", "role": "standalone"})
    quick = progress.started("prod/a")
    stuck = progress.started("prod/b")
    clock.now = 100.0
    progress.finished(quick)
    clock.now = 301.0
    alive, body = progress.report()
    assert not alive and body["stalled"] == ["prod/b"]
    assert "prod/b has not finished in 300 s" in body["message"]
    progress.finished(stuck)
    assert progress.report()[0]
