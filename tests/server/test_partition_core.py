"""PartitionCore: the append task's decisions, event by event, without I/O."""

from __future__ import annotations

from waltz_client.wire.client_messages import MountStatus
from waltz_client.wire.records import ReqId
from waltz_server.partition_core import (
    Assigned,
    Ignored,
    LockConflict,
    PartitionCore,
    Resolved,
)

GEN = 3


def q(client: int = 1, seq: int = 1, generation: int = GEN) -> ReqId:
    return ReqId(client, generation, 0, seq)


def opened(hwm: int = 9) -> PartitionCore:
    core = PartitionCore(GEN, 1 << 10, 3)
    core.session_opened(hwm)
    return core


def append(core, req=None, mounted=None, hwm=9, write=(), read=(), append_locks=()):
    return core.append(req or q(), mounted, hwm, write, read, append_locks)


def test_appends_get_consecutive_ids_after_the_recovered_mark():
    core = opened(9)
    assert append(core) == Assigned(10)
    assert append(core) == Assigned(11)
    assert core.next_transaction_id == 12 and core.high_water_mark == 9


def test_an_append_of_another_generation_is_ignored():
    core = opened()
    assert isinstance(append(core, q(generation=GEN - 1)), Ignored)
    assert isinstance(append(core, q(generation=GEN + 1)), Ignored)
    assert core.next_transaction_id == 10


def test_an_append_on_a_connection_older_than_the_clients_newest_mount_is_ignored():
    core = opened()
    core.mount(q(), 5, "conn-5", "feed-5", "ready")
    assert isinstance(append(core, mounted=4), Ignored)
    assert append(core, mounted=5) == Assigned(10)
    assert append(core, mounted=None) == Assigned(11)  # never mounted there: not fenced
    assert append(core, q(client=2), mounted=4) == Assigned(12)  # another client


def test_a_clients_newest_mount_is_kept_while_any_connection_that_mounted_is_open():
    core = opened()
    core.mount(q(), 5, "conn-5", "feed-5", "ready")
    core.mount(q(), 6, "conn-6", "feed-6", "ready")
    core.connection_closed("conn-6")
    # The older connection is still open: its appends stay fenced.
    assert isinstance(append(core, mounted=5), Ignored)
    assert core.mount(q(), 5, "conn-5", "feed-5b", "ready")[0] == MountStatus.STALE_CONNECTION
    core.connection_closed("conn-5")
    assert core.clients_tracked == 0  # nothing left that an older mount could use
    assert core.mount(q(), 7, "conn-7", "feed-7", "ready")[0] == MountStatus.READY
    core.connection_closed("conn-never-mounted")  # harmless


def test_clients_that_come_and_go_leave_nothing_behind():
    core = opened()
    for client in range(10_000):
        core.mount(q(client=client), 1, f"conn-{client}", f"feed-{client}", "ready")
        core.feed_ended(f"feed-{client}")
        core.connection_closed(f"conn-{client}")
    assert core.clients_tracked == 0
    assert not core._mounted_on and not core._clients_on and not core._mount_feeds


def test_locks_are_taken_at_assignment_so_a_second_append_on_the_same_state_conflicts():
    core = opened(9)
    assert append(core, write=(42,)) == Assigned(10)
    assert append(core, write=(42,), hwm=9) == LockConflict(10)
    assert append(core, read=(42,), hwm=9) == LockConflict(10)
    assert append(core, write=(42,), hwm=10) == Assigned(11)  # up to date with 10


def test_read_locks_are_checked_not_taken_and_append_locks_taken_not_checked():
    core = opened(9)
    assert append(core, read=(7,)) == Assigned(10)
    assert append(core, write=(7,), hwm=9) == Assigned(11)  # the read took nothing
    assert append(core, append_locks=(7,), hwm=0) == Assigned(12)  # not checked
    assert append(core, read=(7,), hwm=11) == LockConflict(12)  # but taken


def test_a_new_session_resets_every_lock_to_the_recovered_mark():
    core = opened(9)
    append(core, write=(42,))
    core.session_opened(20)
    assert core.next_transaction_id == 21
    assert append(core, write=(99,), hwm=19) == LockConflict(20)  # history unknown
    assert append(core, write=(99,), hwm=20) == Assigned(21)


def test_a_new_session_that_keeps_the_locks_forgets_only_what_the_recovery_dropped():
    """The partition ran the session that wrote last (a planned end, a lost replica):
    every transaction up to the mark took its locks in this table, so it is kept."""
    core = opened(9)
    assert append(core, write=(42,)) == Assigned(10)
    assert append(core, write=(43,), hwm=10) == Assigned(11)
    core.committed(10)
    core.session_opened(10, keep_locks=True)  # 11 was not committed: dropped
    assert core.next_transaction_id == 11
    # A client behind the mark conflicts only on what was taken after its own mark
    # (here 9, the mark the table was reset to when this object's first session opened).
    assert append(core, write=(99,), hwm=9) == Assigned(11)
    assert append(core, write=(42,), hwm=9) == LockConflict(10)
    # 43 was taken by the dropped 11: it reads as the mark, not as the new 11.
    assert append(core, write=(43,), hwm=10) == Assigned(12)


def test_a_mount_resolves_once_everything_queued_before_it_commits():
    core = opened(9)
    append(core)
    append(core)  # 10, 11 in flight
    status, previous = core.mount(q(), 1, "c", "feed", "READY")
    assert (status, previous) == (MountStatus.READY, None)
    assert core.resolve() == []
    assert core.committed(10) == []
    assert core.committed(11) == [Resolved("feed", "READY", 11)]
    assert core.committed(12) == []  # once


def test_a_mount_with_nothing_in_flight_resolves_at_once():
    core = opened(9)
    core.mount(q(), 1, "c", "feed", "READY")
    assert core.resolve() == [Resolved("feed", "READY", 9)]


def test_a_new_session_resolves_the_old_sessions_barriers_at_the_recovered_mark():
    core = opened(9)
    append(core)
    append(core)
    core.mount(q(), 1, "c", "feed", "READY")
    assert core.session_opened(10) == [Resolved("feed", "READY", 10)]  # 11 was lost


def test_stale_mounts_are_refused():
    core = opened()
    assert core.mount(q(generation=GEN - 1), 1, "c", "f", "r") == (
        MountStatus.STALE_GENERATION,
        None,
    )
    core.mount(q(), 5, "c5", "f5", "r5")
    assert core.mount(q(), 4, "c4", "f4", "r4") == (MountStatus.STALE_CONNECTION, None)
    assert core.mount(q(), 5, "c5", "f5b", "r5b") == (MountStatus.READY, "f5")  # replaces


def test_a_flush_is_answered_on_its_clients_mount_feed_on_the_same_connection():
    core = opened(9)
    core.mount(q(), 1, "conn", "feed", "READY")
    core.resolve()
    append(core)
    assert core.flush(q(seq=2), "conn", "FLUSH")
    assert core.committed(10) == [Resolved("feed", "FLUSH", 10)]


def test_a_flush_without_a_current_mount_on_its_connection_is_refused():
    core = opened(9)
    assert not core.flush(q(), "conn", "FLUSH")  # never mounted
    core.mount(q(), 1, "conn", "feed", "READY")
    assert not core.flush(q(), "other-conn", "FLUSH")  # mounted elsewhere
    assert not core.flush(q(client=2), "conn", "FLUSH")  # another client's mount
    core.feed_ended("feed")
    assert not core.flush(q(), "conn", "FLUSH")  # the feed ended


def test_answers_queued_on_a_replaced_or_ended_feed_are_dropped():
    core = opened(9)
    append(core)
    core.mount(q(), 1, "conn", "old", "READY-1")
    assert core.flush(q(seq=2), "conn", "FLUSH-1")
    core.mount(q(seq=3), 2, "conn2", "new", "READY-2")
    assert core.committed(10) == [Resolved("new", "READY-2", 10)]
    append(core)
    assert core.flush(q(seq=4), "conn2", "FLUSH-2")
    core.feed_ended("new")
    assert core.committed(11) == []


def test_barriers_resolve_in_the_order_they_were_queued():
    core = opened(9)
    append(core)
    for client in (3, 1, 2):
        core.mount(q(client=client), 1, f"c{client}", f"f{client}", client)
    assert [r.token for r in core.committed(10)] == [3, 1, 2]
