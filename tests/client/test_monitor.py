"""TransactionMonitor: what became of each append this client sent to one partition.

Unit tests (no I/O) of the spec's "Detection of Failed Append Requests", plus a
hypothesis model test against a plain list of pending (ReqId, item) pairs.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from waltz_client.monitor import Outcome, Resolution, TransactionMonitor
from waltz_client.wire.records import ReqId

ME = 7
OTHER = 8


def rid(seq: int, client: int = ME, generation: int = 1, partition: int = 0) -> ReqId:
    return ReqId(client, generation, partition, seq)


def monitor_with(*seqs: int) -> TransactionMonitor[str]:
    m: TransactionMonitor[str] = TransactionMonitor()
    for s in seqs:
        m.sent(rid(s), f"item{s}")
    return m


# --- basics --------------------------------------------------------------------------


def test_empty_monitor() -> None:
    m: TransactionMonitor[str] = TransactionMonitor()
    assert len(m) == 0
    assert list(m.items()) == []
    assert m.pending_ids() == set()
    assert rid(1) not in m
    assert m.committed(rid(1), 10) == []
    assert m.lock_failed(rid(1), 10) is None
    assert m.flushed({rid(1)}) == []
    assert m.mounted() == []


def test_sent_tracks_items_in_send_order() -> None:
    m = monitor_with(3, 1, 2)
    assert len(m) == 3
    assert list(m.items()) == ["item3", "item1", "item2"]
    assert m.pending_ids() == {rid(1), rid(2), rid(3)}
    assert rid(2) in m
    assert rid(4) not in m


def test_pending_ids_is_a_copy() -> None:
    m = monitor_with(1)
    ids = m.pending_ids()
    ids.add(rid(2))
    ids.discard(rid(1))
    assert m.pending_ids() == {rid(1)}


def test_duplicate_sent_is_refused_and_keeps_the_first_item() -> None:
    m = monitor_with(1, 2)
    with pytest.raises(ValueError, match="already pending"):
        m.sent(rid(1), "other")
    assert list(m.items()) == ["item1", "item2"]
    assert len(m) == 2


def test_a_resolved_req_id_may_be_sent_again() -> None:
    m = monitor_with(1)
    m.committed(rid(1), 0)
    m.sent(rid(1), "again")
    assert list(m.items()) == ["again"]


def test_req_ids_differing_in_any_field_are_distinct() -> None:
    m: TransactionMonitor[str] = TransactionMonitor()
    base = ReqId(1, 1, 0, 1)
    variants = [base, ReqId(2, 1, 0, 1), ReqId(1, 2, 0, 1), ReqId(1, 1, 1, 1), ReqId(1, 1, 0, 2)]
    for i, q in enumerate(variants):
        m.sent(q, str(i))
    assert len(m) == len(variants)


# --- committed ---------------------------------------------------------------------


def test_committed_first_pending_resolves_only_it() -> None:
    m = monitor_with(1, 2, 3)
    assert m.committed(rid(1), 41) == [Resolution("item1", Outcome.COMMITTED, 41)]
    assert list(m.items()) == ["item2", "item3"]


def test_committed_loses_every_earlier_pending_in_send_order() -> None:
    m = monitor_with(5, 1, 9, 4, 2)
    out = m.committed(rid(4), 100)
    assert out == [
        Resolution("item5", Outcome.LOST),
        Resolution("item1", Outcome.LOST),
        Resolution("item9", Outcome.LOST),
        Resolution("item4", Outcome.COMMITTED, 100),
    ]
    assert all(r.transaction_id == -1 for r in out[:-1])
    assert list(m.items()) == ["item2"]
    assert m.pending_ids() == {rid(2)}


def test_committed_last_resolves_everything() -> None:
    m = monitor_with(1, 2, 3)
    out = m.committed(rid(3), 7)
    assert [r.outcome for r in out] == [Outcome.LOST, Outcome.LOST, Outcome.COMMITTED]
    assert len(m) == 0


def test_another_clients_req_id_resolves_nothing() -> None:
    m = monitor_with(1, 2)
    assert m.committed(rid(1, client=OTHER), 5) == []
    assert m.committed(rid(1, generation=2), 5) == []
    assert m.committed(rid(3), 5) == []
    assert list(m.items()) == ["item1", "item2"]


def test_committed_twice_resolves_once() -> None:
    m = monitor_with(1, 2)
    assert len(m.committed(rid(1), 0)) == 1
    assert m.committed(rid(1), 0) == []
    assert list(m.items()) == ["item2"]


# --- lock_failed -------------------------------------------------------------------


def test_lock_failed_removes_only_that_entry() -> None:
    m = monitor_with(1, 2, 3)
    assert m.lock_failed(rid(2), 17) == Resolution("item2", Outcome.LOCK_FAILED, 17)
    assert list(m.items()) == ["item1", "item3"]
    assert rid(2) not in m


def test_lock_failed_unknown_is_none() -> None:
    m = monitor_with(1)
    assert m.lock_failed(rid(2), 3) is None
    assert m.lock_failed(rid(1, client=OTHER), 3) is None
    assert list(m.items()) == ["item1"]


def test_lock_failed_then_committed_of_later_does_not_report_it_again() -> None:
    m = monitor_with(1, 2, 3)
    m.lock_failed(rid(1), 4)
    assert m.committed(rid(3), 9) == [
        Resolution("item2", Outcome.LOST),
        Resolution("item3", Outcome.COMMITTED, 9),
    ]


def test_lock_failed_of_a_falsy_item_is_still_resolved() -> None:
    m: TransactionMonitor[int] = TransactionMonitor()
    m.sent(rid(1), 0)
    assert m.lock_failed(rid(1), 2) == Resolution(0, Outcome.LOCK_FAILED, 2)
    assert len(m) == 0


# --- flushed / mounted ---------------------------------------------------------------


def test_flushed_loses_exactly_the_pending_ones_in_the_set() -> None:
    m = monitor_with(1, 2, 3, 4)
    sent_before = {rid(3), rid(1), rid(99), rid(2, client=OTHER)}
    out = m.flushed(sent_before)
    assert out == [Resolution("item1", Outcome.LOST), Resolution("item3", Outcome.LOST)]
    assert list(m.items()) == ["item2", "item4"]


def test_flushed_with_snapshot_ignores_later_sends() -> None:
    m = monitor_with(1, 2)
    snapshot = m.pending_ids()
    m.sent(rid(3), "item3")
    m.committed(rid(1), 0)
    out = m.flushed(snapshot)
    assert out == [Resolution("item2", Outcome.LOST)]
    assert list(m.items()) == ["item3"]


def test_flushed_empty_set() -> None:
    m = monitor_with(1)
    assert m.flushed(set()) == []
    assert len(m) == 1


def test_mounted_loses_everything_in_send_order() -> None:
    """Lost across a remount that succeeded: marked so, a retry need not wait."""
    m = monitor_with(3, 1, 2)
    assert m.mounted() == [
        Resolution("item3", Outcome.LOST, remounted=True),
        Resolution("item1", Outcome.LOST, remounted=True),
        Resolution("item2", Outcome.LOST, remounted=True),
    ]
    assert len(m) == 0
    assert m.mounted() == []


def test_resolution_defaults_and_is_frozen() -> None:
    r = Resolution("x", Outcome.LOST)
    assert r.transaction_id == -1
    with pytest.raises(AttributeError):
        r.outcome = Outcome.COMMITTED  # type: ignore[misc]


# --- model test ---------------------------------------------------------------------

POOL = [rid(s) for s in range(6)] + [rid(0, client=OTHER), rid(1, client=OTHER)]
pool_ids = st.sampled_from(POOL)

ops = st.lists(
    st.one_of(
        st.tuples(st.just("sent"), pool_ids),
        st.tuples(st.just("committed"), pool_ids, st.integers(0, 10**6)),
        st.tuples(st.just("lock_failed"), pool_ids, st.integers(0, 10**6)),
        st.tuples(st.just("flushed"), st.frozensets(pool_ids)),
        st.tuples(st.just("mounted")),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_monitor_matches_list_model(operations: list[tuple]) -> None:
    m: TransactionMonitor[int] = TransactionMonitor()
    model: list[tuple[ReqId, int]] = []  # pending, in send order
    resolved: list[int] = []
    sent_items: list[int] = []
    next_item = 0

    for op in operations:
        kind = op[0]
        if kind == "sent":
            q = op[1]
            item = next_item
            next_item += 1
            if any(mq == q for mq, _ in model):
                with pytest.raises(ValueError):
                    m.sent(q, item)
                continue
            m.sent(q, item)
            model.append((q, item))
            sent_items.append(item)
            got: list[Resolution[int]] = []
            expected: list[Resolution[int]] = []
        elif kind == "committed":
            q, txid = op[1], op[2]
            got = m.committed(q, txid)
            idx = next((i for i, (mq, _) in enumerate(model) if mq == q), None)
            if idx is None:
                expected = []
            else:
                expected = [Resolution(it, Outcome.LOST) for _, it in model[:idx]]
                expected.append(Resolution(model[idx][1], Outcome.COMMITTED, txid))
                del model[: idx + 1]
        elif kind == "lock_failed":
            q, txid = op[1], op[2]
            one = m.lock_failed(q, txid)
            got = [] if one is None else [one]
            idx = next((i for i, (mq, _) in enumerate(model) if mq == q), None)
            if idx is None:
                expected = []
            else:
                expected = [Resolution(model[idx][1], Outcome.LOCK_FAILED, txid)]
                del model[idx]
        elif kind == "flushed":
            before = set(op[1])
            got = m.flushed(before)
            expected = [Resolution(it, Outcome.LOST) for mq, it in model if mq in before]
            model = [(mq, it) for mq, it in model if mq not in before]
        else:
            got = m.mounted()
            expected = [Resolution(it, Outcome.LOST, remounted=True) for _, it in model]
            model = []

        assert got == expected, (kind, op)
        resolved.extend(r.item for r in got)
        # the monitor's state is the model's
        assert list(m.items()) == [it for _, it in model]
        assert m.pending_ids() == {mq for mq, _ in model}
        assert len(m) == len(model)
        for q in POOL:
            assert (q in m) == any(mq == q for mq, _ in model)

    # every item resolved at most once; resolved and pending partition what was sent
    assert len(resolved) == len(set(resolved))
    pending = [it for _, it in model]
    assert sorted(resolved + pending) == sorted(sent_items)
