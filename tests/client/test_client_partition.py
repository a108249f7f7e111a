"""ClientPartition, message by message: the mount's phases and what each answer
settles, the feed's order, flushes, refusals and the pauses between mount attempts.
No I/O: these feed the core the messages a stream would bring and check its decisions.
(``test_client_partition_model`` drives it against a model server.)"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from waltz_client.client_partition import (
    MAX_OWNER_WAIT,
    REFUSED_MOUNT_PAUSE,
    ClientPartition,
    FeedSpan,
    MountNext,
    MountPhase,
)
from waltz_client.errors import Forbidden, MissingTransactions, Unauthorized, WaltzError
from waltz_client.monitor import Outcome
from waltz_client.submit_policy import MAX_BACKOFF
from waltz_client.wire.client_messages import (
    ErrorCode,
    ErrorResponse,
    FeedRow,
    FeedSuspended,
    FlushResponse,
    LockFailure,
    MountResponse,
    MountStatus,
)
from waltz_client.wire.records import ReqId

ME = 7
OTHER = 8
BACKOFF = 0.05


def rid(seq: int, client: int = ME, generation: int = 3) -> ReqId:
    return ReqId(client, generation, 0, seq)


MOUNT = rid(1)


def mounted(applies: bool = True, *pending: int) -> ClientPartition[str]:
    """Mounted at MOUNT from -1, with appends of these seqs pending."""
    core: ClientPartition[str] = ClientPartition(0, applies, BACKOFF)
    core.mount_sent(MOUNT, -1)
    core.receive(MountResponse(MOUNT, MountStatus.READY))
    for seq in pending:
        core.monitor.sent(rid(seq), f"a{seq}")
    return core


def outcomes(resolutions) -> list[tuple[str, Outcome, int]]:
    return [(r.item, r.outcome, r.transaction_id) for r in resolutions]


# --- mounting ---------------------------------------------------------------------------


def test_a_mount_goes_through_its_phases() -> None:
    core: ClientPartition[str] = ClientPartition(0, True, BACKOFF)
    assert (core.phase, core.mount_req, core.applied, core.generation) == (
        MountPhase.UNMOUNTED,
        None,
        -1,
        -1,
    )
    core.mount_sent(MOUNT, 41)
    assert (core.phase, core.mount_req, core.applied, core.generation) == (
        MountPhase.MOUNTING,
        MOUNT,
        41,
        3,
    )
    reaction = core.receive(MountResponse(MOUNT, MountStatus.READY))
    assert reaction.mount_status == MountStatus.READY and core.phase is MountPhase.MOUNTED
    core.remounting()
    assert core.phase is MountPhase.UNMOUNTED and core.mount_req == MOUNT  # until the next


def test_ready_settles_every_pending_append_as_lost() -> None:
    core = mounted(True, 5, 6)
    core.remounting()
    second = rid(7)
    core.mount_sent(second, -1)
    reaction = core.receive(MountResponse(second, MountStatus.READY))
    assert outcomes(reaction.settled) == [("a5", Outcome.LOST, -1), ("a6", Outcome.LOST, -1)]
    assert not core.monitor


@pytest.mark.parametrize(
    "status",
    [MountStatus.NOT_OWNER, MountStatus.STALE_GENERATION, MountStatus.STALE_CONNECTION],
)
def test_a_mount_not_ready_settles_nothing(status: MountStatus) -> None:
    core = mounted(True, 5)
    core.remounting()
    core.mount_sent(rid(6), -1)
    reaction = core.receive(MountResponse(rid(6), status))
    assert reaction.mount_status == status and reaction.settled == []
    assert core.phase is MountPhase.UNMOUNTED and len(core.monitor) == 1


def test_answers_to_other_mounts_are_ignored() -> None:
    core = mounted(True, 5)
    core.remounting()
    core.mount_sent(rid(6), -1)
    reaction = core.receive(MountResponse(MOUNT, MountStatus.READY))  # the older mount's
    assert reaction.settled == [] and reaction.mount_status is None
    assert core.phase is MountPhase.MOUNTING and len(core.monitor) == 1


def test_a_late_ready_settles_but_opens_nothing() -> None:
    """A mount given up on (timed out) and answered after: the answer still settles what
    was sent before it, but nobody waits for it and appends stay blocked."""
    core = mounted(True, 5)
    core.remounting()
    core.mount_sent(rid(6), -1)
    core.mount_abandoned()
    reaction = core.receive(MountResponse(rid(6), MountStatus.READY))
    assert outcomes(reaction.settled) == [("a5", Outcome.LOST, -1)]
    assert reaction.mount_status is None and core.phase is MountPhase.UNMOUNTED


def test_mount_answers_decide_the_next_attempt() -> None:
    core: ClientPartition[str] = ClientPartition(0, True, BACKOFF)
    waits = [core.mount_answered(MountStatus.NOT_OWNER).pause for _ in range(7)]
    assert waits == [0.05, 0.1, 0.2, 0.4, 0.8, MAX_OWNER_WAIT, MAX_OWNER_WAIT]
    stale = core.mount_answered(MountStatus.STALE_CONNECTION)
    assert stale.close_stream and stale.until_view_changes and not stale.ready
    assert not core.mount_answered(MountStatus.STALE_GENERATION).close_stream
    assert core.mount_answered(MountStatus.READY) == MountNext(ready=True)
    assert core.backoff.current == BACKOFF  # a success starts the backoff over


def test_failed_attempts_back_off_up_to_the_cap() -> None:
    core: ClientPartition[str] = ClientPartition(0, True, BACKOFF)
    pauses = [core.mount_failed(TimeoutError()).pause for _ in range(8)]
    assert pauses == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, MAX_BACKOFF, MAX_BACKOFF]
    assert core.refusal is None


def test_a_failed_attempt_abandons_the_mount_under_way() -> None:
    core: ClientPartition[str] = ClientPartition(0, True, BACKOFF)
    core.mount_sent(MOUNT, -1)
    core.mount_failed(ConnectionError("closed"))
    assert core.phase is MountPhase.UNMOUNTED


def test_a_refusal_is_kept_said_once_and_cleared_by_a_mount() -> None:
    core: ClientPartition[str] = ClientPartition(0, True, BACKOFF)
    no = Forbidden("mount: FORBIDDEN: not you")
    first = core.mount_failed(no)
    assert first.new_refusal and first.pause == REFUSED_MOUNT_PAUSE and core.refusal is no
    again = core.mount_failed(Forbidden("mount: FORBIDDEN: not you"))
    assert not again.new_refusal  # the same reason: not logged again
    other = core.mount_failed(Unauthorized("allocating a client ID: LIMIT_EXCEEDED: quota"))
    assert other.new_refusal and other.pause == REFUSED_MOUNT_PAUSE  # backoff 0.2 s < floor
    for _ in range(4):
        core.mount_failed(other)
    assert core.mount_failed(other).pause == MAX_BACKOFF  # the backoff grew past the floor
    core.mount_answered(MountStatus.READY)
    assert core.refusal is None


def test_below_the_log_start_a_watched_partition_moves_on_and_an_applied_one_refuses() -> None:
    gone = MissingTransactions(0, 0, 120)
    watched: ClientPartition[str] = ClientPartition(0, False, BACKOFF)
    assert watched.mount_failed(gone) == MountNext()  # at once, from the log start
    assert watched.applied == 119 and watched.refusal is None
    applied: ClientPartition[str] = ClientPartition(0, True, BACKOFF)
    step = applied.mount_failed(gone)
    assert step.new_refusal and step.pause == REFUSED_MOUNT_PAUSE and applied.refusal is gone
    assert applied.applied == -1  # the application must restore: its mark stays


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (ErrorCode.FORBIDDEN, Forbidden),
        (ErrorCode.UNAUTHORIZED, Unauthorized),
        (ErrorCode.LIMIT_EXCEEDED, WaltzError),
    ],
)
def test_an_error_answering_the_mount_refuses_it(code: ErrorCode, kind: type) -> None:
    core: ClientPartition[str] = ClientPartition(0, True, BACKOFF)
    core.mount_sent(MOUNT, 9)
    reaction = core.receive(ErrorResponse(MOUNT, code, "no"))
    assert type(reaction.mount_error) is kind
    assert str(reaction.mount_error) == f"mount: {code.name}: no"
    assert not reaction.remount and core.phase is MountPhase.UNMOUNTED


def test_truncated_names_the_log_start() -> None:
    core: ClientPartition[str] = ClientPartition(4, True, BACKOFF)
    q = ReqId(ME, 3, 4, 1)
    core.mount_sent(q, 9)
    message = "partition 4: transaction 10 is below the log start; the first available is 57"
    error = core.receive(ErrorResponse(q, ErrorCode.TRUNCATED, message)).mount_error
    assert isinstance(error, MissingTransactions)
    assert (error.partition_id, error.requested, error.first_available) == (4, 10, 57)


def test_an_error_after_the_answer_means_the_feed_ended() -> None:
    core = mounted()
    reaction = core.receive(ErrorResponse(MOUNT, ErrorCode.TRUNCATED, "gone"))
    assert reaction.remount and reaction.note == "feed ended: gone"
    assert reaction.mount_error is None


def test_feed_suspended_remounts_only_for_the_current_mount() -> None:
    core = mounted()
    reaction = core.receive(FeedSuspended(MOUNT, "moved"))
    assert reaction.remount and reaction.note == "feed suspended: moved"
    assert reaction.owner_gone  # its server serves the partition no more: look elsewhere
    assert not core.receive(FeedSuspended(rid(99), "an older mount")).remount
    # A feed that ended for another reason (retention) is mounted again where it was.
    ended = core.receive(ErrorResponse(MOUNT, ErrorCode.TRUNCATED, "gone"))
    assert ended.remount and not ended.owner_gone


def test_start_marks() -> None:
    watched: ClientPartition[str] = ClientPartition(0, False, BACKOFF)
    assert not watched.has_start_mark()
    watched.start_at(-1)  # an empty log: still unknown, asked again
    assert not watched.has_start_mark()
    watched.start_at(30)
    assert watched.has_start_mark() and watched.applied == 30
    fresh: ClientPartition[str] = ClientPartition(0, False, BACKOFF)
    fresh.mount_sent(MOUNT, -1)
    assert fresh.has_start_mark()


# --- the feed ---------------------------------------------------------------------------


def feed(*txids: int) -> list[tuple[int, int, int, int, int, int]]:
    return [(t, OTHER, 0, 0, t, 0) for t in txids]


def test_a_feed_message_is_seen_before_then_delivered_in_order_up_to_a_gap() -> None:
    core = mounted()
    core.delivered(0)
    core.delivered(1)
    assert core.deliverable(feed(0, 1, 2, 3)) == FeedSpan(2, 4, None)
    assert core.deliverable(feed(2, 3, 5, 6)) == FeedSpan(0, 2, 5)
    assert core.deliverable(feed(0, 1)) == FeedSpan(2, 2, None)  # all seen before
    assert core.deliverable(feed(4, 5)) == FeedSpan(0, 0, 4)  # a gap at once
    assert core.deliverable(feed(2, 1)) == FeedSpan(0, 1, 1)  # going back breaks the order
    assert core.deliverable([]) == FeedSpan(0, 0, None)


def test_a_commit_settles_it_and_everything_sent_before() -> None:
    core = mounted(True, 5, 6, 7)
    assert core.commit_seen(rid(5, client=OTHER), 0) == []  # another client's
    assert outcomes(core.commit_seen(rid(6), 1)) == [
        ("a5", Outcome.LOST, -1),
        ("a6", Outcome.COMMITTED, 1),
    ]
    assert len(core.monitor) == 1


def row(txid: int, q: ReqId) -> FeedRow:
    return (txid, q.client_id, q.generation, q.partition_id, q.seq, 0, 1_700_000_000_000 + txid)


def test_take_feed_moves_the_mark_and_settles_our_rows() -> None:
    core = mounted(False, 5)
    rows = [row(0, rid(5, client=OTHER)), row(1, rid(5)), row(2, rid(6, client=OTHER))]
    taken = core.take_feed(MOUNT, rows, ME)
    assert outcomes(taken.settled) == [("a5", Outcome.COMMITTED, 1)]
    assert core.applied == 2 and taken.gap is None
    again = core.take_feed(MOUNT, rows[1:], ME)  # an overlap: nothing twice
    assert again.settled == [] and core.applied == 2


def test_take_feed_ignores_older_mounts_and_stops_at_a_gap() -> None:
    core = mounted(False, 5, 6)
    assert core.take_feed(rid(99), [row(0, rid(5))], ME).settled == []
    assert core.applied == -1
    taken = core.take_feed(MOUNT, [row(0, rid(5)), row(2, rid(6))], ME)
    assert taken.gap == 2 and core.applied == 0
    assert outcomes(taken.settled) == [("a5", Outcome.COMMITTED, 0)]
    # The rest of that feed is ignored, and its answers settle nothing: appends whose
    # commits were beyond the gap wait for the next mount.
    assert not core.is_current_feed(MOUNT)
    assert core.take_feed(MOUNT, [row(1, rid(8, client=OTHER))], ME).settled == []
    assert core.receive(MountResponse(MOUNT, MountStatus.READY)).settled == []
    assert len(core.monitor) == 1


def test_a_stopped_feed_is_ignored_and_its_answers_settle_nothing() -> None:
    """``apply_transaction`` failed on the feed while the mount was under way: the rest
    of the feed (which may hold one of our commits) was not seen, so the mount's READY
    must not call our pending appends lost; the next mount's answer settles them."""
    core: ClientPartition[str] = ClientPartition(0, True, BACKOFF)
    core.mount_sent(MOUNT, -1)
    core.monitor.sent(rid(0, generation=2), "a")
    assert core.feed_stopped(MOUNT)
    assert not core.is_current_feed(MOUNT)
    reaction = core.receive(MountResponse(MOUNT, MountStatus.READY))
    assert reaction.settled == [] and reaction.mount_status == MountStatus.READY
    core.remounting()
    core.mount_sent(rid(2), -1)
    assert core.is_current_feed(rid(2))
    assert outcomes(core.receive(MountResponse(rid(2), MountStatus.READY)).settled) == [
        ("a", Outcome.LOST, -1)
    ]


def test_a_stop_on_an_older_feed_changes_nothing() -> None:
    core = mounted()
    assert not core.feed_stopped(rid(99))
    assert core.is_current_feed(MOUNT)


@given(
    st.lists(
        st.tuples(st.integers(0, 30), st.integers(1, 6), st.booleans()), min_size=1, max_size=40
    )
)
def test_take_feed_delivers_each_transaction_once_in_order(messages) -> None:
    """Feed messages cut anywhere from one log, overlapping, repeating, skipping ahead or
    from an older mount: the mark moves only across rows the current mount's message
    carried, one transaction after the other, and each of our appends is committed
    once, at its own ID (none is lost: they are all in the log)."""
    log = [rid(t, client=ME if t % 3 == 0 else OTHER, generation=1) for t in range(40)]
    core: ClientPartition[int] = ClientPartition(0, False, BACKOFF)
    mounts = [rid(100)]
    core.mount_sent(mounts[-1], -1)
    for t in range(0, 40, 3):
        core.monitor.sent(log[t], t)
    committed: dict[int, int] = {}
    for start, count, current in messages:
        rows = [row(t, log[t]) for t in range(start, min(40, start + count))]
        before = core.applied
        taken = core.take_feed(mounts[-1] if current else rid(99), rows, ME)
        passed = set(range(before + 1, core.applied + 1))
        assert passed <= {r[0] for r in rows} and (current or not passed)
        for r in taken.settled:
            assert r.item not in committed and r.outcome == Outcome.COMMITTED
            committed[r.item] = r.transaction_id
        if taken.gap is not None:  # mount again, from the mark
            mounts.append(rid(100 + len(mounts)))
            core.remounting()
            core.mount_sent(mounts[-1], core.applied)
    assert committed == {t: t for t in range(0, core.applied + 1, 3)}


# --- flushes, lock failures, refused appends ----------------------------------------


def test_a_flush_settles_what_was_pending_when_it_was_sent() -> None:
    core = mounted(True, 5, 6)
    core.flush_sent(rid(10))
    core.monitor.sent(rid(7), "a7")  # after the flush: not covered
    reaction = core.receive(FlushResponse(rid(10), 44))
    assert outcomes(reaction.settled) == [("a5", Outcome.LOST, -1), ("a6", Outcome.LOST, -1)]
    assert (reaction.flush, reaction.flush_high_water_mark, reaction.flush_error) == (
        rid(10),
        44,
        None,
    )
    assert [r.item for r in core.monitor.mounted()] == ["a7"]
    assert core.receive(FlushResponse(rid(10), 44)).flush is None  # answered once


def test_a_flush_sent_under_an_older_mount_settles_nothing() -> None:
    core = mounted(True, 5)
    core.flush_sent(rid(10))
    core.remounting()
    core.mount_sent(rid(11), -1)
    reaction = core.receive(FlushResponse(rid(10), 44))
    assert reaction.settled == [] and reaction.flush == rid(10)


def test_an_abandoned_flush_is_forgotten() -> None:
    core = mounted(True, 5)
    core.flush_sent(rid(10))
    core.flush_abandoned(rid(10))
    reaction = core.receive(FlushResponse(rid(10), 44))
    assert reaction.flush is None and reaction.settled == [] and len(core.monitor) == 1


@pytest.mark.parametrize(
    ("code", "current", "remount"),
    [
        (ErrorCode.NOT_MOUNTED, True, True),
        (ErrorCode.NOT_MOUNTED, False, False),
        (ErrorCode.NOT_OWNER, True, False),
    ],
)
def test_a_refused_flush(code: ErrorCode, current: bool, remount: bool) -> None:
    core = mounted(True, 5)
    core.flush_sent(rid(10))
    if not current:
        core.remounting()
        core.mount_sent(rid(11), -1)
    reaction = core.receive(ErrorResponse(rid(10), code, "no"))
    assert reaction.remount == remount and reaction.settled == []
    assert reaction.flush == rid(10)
    assert str(reaction.flush_error) == f"flush: {code.name}: no"


def test_a_lock_failure_refuses_that_append_only() -> None:
    core = mounted(True, 5, 6)
    reaction = core.receive(LockFailure(rid(6), 33))
    assert outcomes(reaction.settled) == [("a6", Outcome.LOCK_FAILED, 33)]
    assert core.receive(LockFailure(rid(6), 33)).settled == []  # settled once
    assert len(core.monitor) == 1


def test_an_error_answering_an_append_refuses_it() -> None:
    core = mounted(True, 5)
    reaction = core.receive(ErrorResponse(rid(5), ErrorCode.FORBIDDEN, "read only"))
    [refused] = reaction.settled
    assert (refused.item, refused.outcome, refused.reason) == (
        "a5",
        Outcome.REFUSED,
        "FORBIDDEN: read only",
    )
    assert not reaction.remount


def test_overdue_appends() -> None:
    core = mounted(True)
    sent_at = {"a5": 10.0, "a6": 12.0}
    assert not core.overdue(100.0, 30.0, sent_at.__getitem__)  # nothing pending
    core.monitor.sent(rid(5), "a5")
    core.monitor.sent(rid(6), "a6")
    assert not core.overdue(40.0, 30.0, sent_at.__getitem__)
    assert core.overdue(40.5, 30.0, sent_at.__getitem__)
