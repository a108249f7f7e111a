"""The optimistic lock table: never a false negative, and exact when locks do not collide."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from waltz_server.lock_table import LockTable


def test_new_table_lets_everything_through():
    table = LockTable(size=64, hashes=3)
    assert table.conflict(-1, [1, 2, 3]) is None


def test_conflict_reports_the_transaction_that_took_the_lock():
    table = LockTable()
    table.commit(10, [42])
    assert table.conflict(9, [42]) == 10  # the client had not seen transaction 10
    assert table.conflict(10, [42]) is None  # it had
    assert table.conflict(5, [43]) is None  # another lock
    table.commit(20, [43])
    assert table.conflict(5, [42, 43]) == 20  # the newest conflicting transaction


def test_reset_makes_every_lock_as_new_as_the_log():
    table = LockTable(size=128)
    table.reset(50)
    assert table.conflict(49, [7]) == 50
    assert table.conflict(50, [7]) is None


def test_reset_covers_the_locks_of_transactions_it_drops():
    table = LockTable(size=1 << 16)
    table.commit(5, [1])
    table.commit(60, [2])  # assigned, never committed: the recovery below drops it
    table.reset(50)
    assert table.estimate(1) == table.estimate(2) == table.estimate(3) == 50
    table.commit(51, [2])  # 51 is given again, to another transaction
    assert table.estimate(2) == 51 and table.estimate(1) == 50


def test_reset_below_the_current_mark_rewrites_the_table():
    table = LockTable(size=64)
    table.commit(30, [1])
    table.settled(30)
    table.reset(40)
    table.reset(20)  # not in a running cluster (the committed prefix never shrinks)
    assert table.estimate(1) == table.estimate(2) == 20


def test_truncate_keeps_the_table_and_forgets_only_the_dropped_transactions():
    table = LockTable(size=1 << 16)
    table.reset(4)
    table.commit(5, [1])
    table.commit(6, [2])
    table.settled(6)  # 5 and 6 committed
    table.commit(7, [3])  # in flight when the session ended; the recovery kept it
    table.commit(8, [1, 4])  # in flight; the recovery dropped it
    table.truncate(7)
    assert table.estimate(2) == 6  # kept exactly: a client at 6 does not conflict
    assert table.estimate(3) == 7
    # Taken by the dropped 8: lowered to the mark (8 is given again, to another
    # transaction), not to what it was before (the table does not know it).
    assert table.estimate(1) == table.estimate(4) == 7
    assert table.estimate(5) == 4  # never taken: the last reset
    assert table.conflict(6, [2, 5]) is None
    assert table.conflict(6, [1]) == 7


def test_invalid_sizes_are_refused():
    with pytest.raises(ValueError):
        LockTable(size=0)
    with pytest.raises(ValueError):
        LockTable(hashes=0)


@given(
    size=st.sampled_from([1, 7, 64, 4096]),
    hashes=st.integers(1, 4),
    history=st.lists(
        st.tuples(st.integers(0, 30), st.lists(st.integers(-(2**31), 2**31 - 1), max_size=3)),
        max_size=40,
    ),
    probe=st.tuples(st.integers(-1, 45), st.lists(st.integers(0, 30), max_size=3)),
)
def test_no_false_negatives(size, hashes, history, probe):
    """Whenever a lock's last writer is newer than the client, the table says so."""
    table = LockTable(size=size, hashes=hashes)
    exact: dict[int, int] = {}
    locks = [h for _, hs in history for h in hs]
    for txid, (_, lock_idx) in enumerate(history):
        taken = [locks[i % len(locks)] for i in lock_idx] if locks else []
        table.commit(txid, taken)
        for h in taken:
            exact[h] = txid
    client_hwm, probe_idx = probe
    asked = [locks[i % len(locks)] for i in probe_idx] if locks else []
    truly = max((exact[h] for h in asked if h in exact and exact[h] > client_hwm), default=None)
    reported = table.conflict(client_hwm, asked)
    if truly is not None:
        assert reported is not None and reported >= truly
    for h in asked:
        assert table.estimate(h) >= exact.get(h, -1)


def test_large_table_has_no_false_conflicts_for_distinct_locks():
    table = LockTable(size=1 << 16, hashes=3)
    for txid in range(1000):
        table.commit(txid, [txid])
    # Each lock's estimate is its own last writer: collisions among 1000 locks in 65536
    # slots with 3 hashes do not raise a minimum.
    exact = sum(table.estimate(h) == h for h in range(1000))
    assert exact >= 995


@given(
    hashes=st.integers(1, 3),
    events=st.lists(
        st.one_of(
            st.tuples(st.just("take"), st.lists(st.integers(0, 5), max_size=3)),
            st.tuples(st.just("commit"), st.integers(0, 3)),
            st.tuples(st.just("truncate"), st.integers(0, 3)),
            st.tuples(st.just("reset"), st.integers(0, 3)),
        ),
        max_size=40,
    ),
)
def test_sessions_that_keep_or_reset_the_table_match_a_model(hashes, events):
    """Appends take locks at assignment; some commit; a new session keeps the table
    (truncate) or resets it, at a recovered mark between the committed and the assigned
    ends. Against a per-lock model (no collisions in a large table): the estimate is the
    last transaction that still exists and took the lock, or the mark of a reset, or the
    mark of a truncation that dropped one that took it, whichever is newest."""
    table = LockTable(size=1 << 20, hashes=hashes)
    log: list[tuple[int, list[int]]] = []  # assigned transactions that still exist
    committed = -1
    floor = -1
    lowered: dict[int, int] = {}  # lock -> mark of the last truncation that dropped a taker
    for kind, arg in events:
        assigned = log[-1][0] if log else committed
        if kind == "take":
            table.commit(assigned + 1, arg)
            log.append((assigned + 1, arg))
        elif kind == "commit":
            committed = min(assigned, committed + arg)
            table.settled(committed)
        else:
            mark = min(assigned, committed + arg)  # the recovery keeps at least the committed
            for txid, locks in log:
                if txid > mark:
                    for h in locks:
                        lowered[h] = mark
            log = [(t, locks) for t, locks in log if t <= mark]
            committed = mark
            if kind == "truncate":
                table.truncate(mark)
            else:
                table.reset(mark)
                floor = mark
        for h in range(6):
            taken = max((t for t, locks in log if h in locks), default=-1)
            assert table.estimate(h) == max(taken, floor, lowered.get(h, -1)), (h, events)


def test_a_table_is_allocated_only_when_a_lock_is_taken():
    """512 KiB a partition at the default size: a server taking a hundred partitions at
    once allocated them all before recovering any. Until a lock is taken, nothing."""
    t = LockTable()
    t.reset(10)
    assert t.conflict(5, [1, 2, 3]) == 10
    t.commit(11, [])  # an append without locks
    t.truncate(10)
    assert t._marks is None
    t.commit(12, [7])
    assert t._marks is not None and t.conflict(11, [7]) == 12 and t.conflict(11, [8]) is None
    t.reset(5)  # the log went back: the table goes, every entry reads as the mark
    assert t._marks is None and t.conflict(4, [7]) == 5
