"""SubmissionRetries and Backoff: what follows each attempt of a submission, and the
Append a builder becomes. Pure: no client, no clock."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from waltz_client.append import append_request, size_problem
from waltz_client.errors import Forbidden, MissingTransactions, Unauthorized
from waltz_client.monitor import Outcome, Resolution
from waltz_client.submit_policy import (
    MAX_BACKOFF,
    Backoff,
    Finish,
    RetryAfter,
    RetryWhenApplied,
    SubmissionRetries,
    SubmitResult,
    SubmitStatus,
    completion_hook,
)
from waltz_client.transaction import Lock, TransactionBuilder
from waltz_client.wire.client_messages import MAX_LOCKS, AppendRequest
from waltz_client.wire.records import DEFAULT_MAX_DATA_BYTES, ReqId

LOST = Resolution("s", Outcome.LOST)


def attempted(retries: SubmissionRetries) -> SubmissionRetries:
    retries.begin_attempt()
    return retries


def test_backoff_doubles_up_to_the_cap_and_starts_over() -> None:
    backoff = Backoff(0.3)
    assert [backoff.grow() for _ in range(5)] == [0.3, 0.6, 1.2, MAX_BACKOFF, MAX_BACKOFF]
    backoff.reset()
    assert backoff.current == 0.3


def test_a_first_pause_above_the_cap_is_taken_once() -> None:
    backoff = Backoff(5.0)
    assert [backoff.grow() for _ in range(3)] == [5.0, MAX_BACKOFF, MAX_BACKOFF]


@given(st.floats(0.001, 10.0), st.integers(1, 30))
def test_backoff_pauses_double_from_the_first_up_to_the_cap(first: float, n: int) -> None:
    backoff = Backoff(first)
    pauses = [backoff.grow() for _ in range(n)]
    assert pauses[0] == first
    assert all(p <= max(first, MAX_BACKOFF) for p in pauses)
    assert all(b == min(MAX_BACKOFF, 2 * a) for a, b in itertools.pairwise(pauses))


def test_a_committed_attempt_finishes_the_submission() -> None:
    retries = attempted(attempted(SubmissionRetries(5, 0.05)))
    step = retries.after(Resolution("s", Outcome.COMMITTED, 17))
    assert step == Finish(SubmitResult(SubmitStatus.COMMITTED, 17, 2))
    assert step.result.committed


def test_execute_giving_up_ignores_the_submission() -> None:
    step = attempted(SubmissionRetries(5, 0.05)).after(None)
    assert step == Finish(SubmitResult(SubmitStatus.IGNORED, attempts=1))


def test_a_refused_append_fails_at_once() -> None:
    step = attempted(SubmissionRetries(5, 0.05)).after(
        Resolution("s", Outcome.REFUSED, reason="FORBIDDEN: read only")
    )
    assert step == Finish(
        SubmitResult(
            SubmitStatus.FAILED, attempts=1, reason="the server refused it: FORBIDDEN: read only"
        )
    )


def test_a_lost_append_runs_again_after_a_growing_pause() -> None:
    retries = SubmissionRetries(5, 0.05)
    steps = [attempted(retries).after(LOST) for _ in range(4)]
    assert steps == [RetryAfter(0.05), RetryAfter(0.1), RetryAfter(0.2), RetryAfter(0.4)]


def test_an_append_lost_across_a_successful_remount_runs_again_at_once() -> None:
    """A hand-over: the new owner's mount answered, so the retry goes there now. The
    backoff is not started, and a loss while mounted still pauses from the first step."""
    retries = SubmissionRetries(5, 0.05)
    remounted = Resolution("s", Outcome.LOST, remounted=True)
    assert [attempted(retries).after(remounted) for _ in range(2)] == [RetryAfter(0.0)] * 2
    assert retries.backoff is None
    assert attempted(retries).after(LOST) == RetryAfter(0.05)
    assert attempted(retries).after(remounted) == RetryAfter(0.0)
    assert not attempted(retries).may_attempt(closed=False)  # still counted as attempts


def test_a_lock_failure_runs_again_once_its_transaction_is_applied() -> None:
    retries = SubmissionRetries(5, 0.05)
    step = attempted(retries).after(Resolution("s", Outcome.LOCK_FAILED, 41))
    assert step == RetryWhenApplied(41)
    assert retries.backoff is None  # no backoff: the newer state is what it needs


def test_out_of_attempts_it_gives_up_naming_the_last_failure() -> None:
    retries = SubmissionRetries(2, 0.05)
    assert retries.may_attempt(closed=False)
    attempted(retries).after(LOST)
    attempted(retries).after(Resolution("s", Outcome.LOCK_FAILED, 9))
    assert not retries.may_attempt(closed=False)
    assert retries.gave_up() == SubmitResult(
        SubmitStatus.FAILED,
        attempts=2,
        reason="gave up after 2 attempts: lock failure against transaction 9",
    )
    lost = SubmissionRetries(1, 0.05)
    attempted(lost).after(LOST)
    assert lost.gave_up().reason == (
        "gave up after 1 attempts: the append was lost (server or connection failure)"
    )


def test_a_closed_client_attempts_no_more() -> None:
    assert not SubmissionRetries(5, 0.05).may_attempt(closed=True)


@given(
    st.lists(st.sampled_from([Outcome.LOST, Outcome.LOCK_FAILED]), max_size=30), st.integers(1, 10)
)
def test_never_more_attempts_than_the_limit(failures: list[Outcome], limit: int) -> None:
    retries = SubmissionRetries(limit, 0.05)
    for outcome in failures:
        if not retries.may_attempt(closed=False):
            break
        retries.begin_attempt()
        assert not isinstance(retries.after(Resolution("s", outcome, 3)), Finish)
    assert retries.attempts == min(limit, len(failures))


def test_a_contexts_own_limit_wins() -> None:
    assert SubmissionRetries.for_context(None, 20, 0.05).limit == 20
    assert SubmissionRetries.for_context(3, 20, 0.05).limit == 3


def test_a_refused_mount_fails_the_submission() -> None:
    retries = attempted(SubmissionRetries(5, 0.05))
    forbidden = retries.mount_refused(Forbidden("mount: FORBIDDEN: no"))
    assert forbidden == Finish(
        SubmitResult(SubmitStatus.FAILED, attempts=1, reason="mount: FORBIDDEN: no")
    )
    assert retries.mount_refused(Unauthorized("quota")).result.reason == "quota"
    gone = MissingTransactions(0, 3, 10)
    below = retries.mount_refused(gone)
    assert below.error is gone  # the context's on_exception hears of it
    assert below.result.reason == f"mount refused: {gone!r}"


def test_a_failing_step_of_the_application_is_named() -> None:
    error = KeyError("row")
    step = attempted(SubmissionRetries(5, 0.05)).step_failed("Transfer.execute", error)
    assert step.error is error
    assert step.result == SubmitResult(
        SubmitStatus.FAILED, attempts=1, reason="Transfer.execute raised KeyError('row')"
    )


# --- the Append a builder becomes -------------------------------------------------------


def test_an_append_carries_the_builders_fields_and_lock_hashes() -> None:
    builder = TransactionBuilder(2, 40)
    builder.set_header(-5)
    builder.set_data(b"payload")
    builder.set_write_locks(Lock("account", 1))
    builder.set_read_locks(Lock("account", 2), Lock("branch", 1))
    q = ReqId(7, 3, 2, 11)
    assert append_request(q, builder) == AppendRequest(
        q,
        40,
        (Lock("account", 1).hash32(),),
        (Lock("account", 2).hash32(), Lock("branch", 1).hash32()),
        (),
        -5,
        b"payload",
    )


def test_size_problems() -> None:
    builder = TransactionBuilder(0, -1)
    assert size_problem(builder) == ""
    builder.set_data(bytes(DEFAULT_MAX_DATA_BYTES))
    assert size_problem(builder) == ""
    builder.set_data(bytes(DEFAULT_MAX_DATA_BYTES + 1))
    assert size_problem(builder) == (
        f"transaction data of {DEFAULT_MAX_DATA_BYTES + 1} bytes exceeds {DEFAULT_MAX_DATA_BYTES}"
    )
    builder.set_data(b"")
    builder.set_append_locks(*(Lock("l", i) for i in range(MAX_LOCKS + 1)))
    assert size_problem(builder) == f"{MAX_LOCKS + 1} append_locks exceed {MAX_LOCKS}"


@pytest.mark.parametrize("kind", ["write_locks", "read_locks"])
def test_too_many_locks_of_a_kind(kind: str) -> None:
    builder = TransactionBuilder(0, -1)
    setattr(builder, kind, [Lock("l", i) for i in range(MAX_LOCKS + 1)])
    assert size_problem(builder) == f"{MAX_LOCKS + 1} {kind} exceed {MAX_LOCKS}"


def test_the_deadline_is_the_contexts_own_else_the_clients() -> None:
    assert SubmissionRetries.for_context(None, 20, 0.05, 100.0, None, 120.0).deadline == 220.0
    assert SubmissionRetries.for_context(None, 20, 0.05, 100.0, 2.5, 120.0).deadline == 102.5
    assert SubmissionRetries.for_context(None, 20, 0.05, 100.0, None, None).deadline is None
    no_deadline = SubmissionRetries(5, 0.05)
    assert not no_deadline.expired(1e12) and no_deadline.remaining(1e12) is None


def test_past_its_deadline_a_submission_expires_naming_its_last_failure() -> None:
    retries = SubmissionRetries(50, 0.05, deadline=10.0)
    assert not retries.expired(9.99) and retries.remaining(9.0) == 1.0
    assert retries.expired(10.0) and retries.remaining(11.0) == 0.0
    attempted(retries).after(Resolution("s", Outcome.LOST))
    finish = retries.expiry()
    assert finish.result.status is SubmitStatus.EXPIRED and finish.error is None
    assert finish.result.reason == (
        "expired after 1 attempts: the append was lost (server or connection failure)"
    )
    waiting = SubmissionRetries(50, 0.05, deadline=10.0)
    waiting.begin_attempt()
    assert "waiting for a mount" in waiting.expiry().result.reason


@pytest.mark.parametrize(
    ("status", "hook"),
    [
        (SubmitStatus.COMMITTED, "on_completion"),
        (SubmitStatus.IGNORED, "on_completion"),
        (SubmitStatus.EXPIRED, "on_expiration"),
        (SubmitStatus.FAILED, "on_exception"),
    ],
)
def test_each_ending_has_one_hook(status: SubmitStatus, hook: str) -> None:
    assert completion_hook(SubmitResult(status)) == hook
