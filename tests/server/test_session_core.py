"""SessionCore: a store session's decisions, event by event, without I/O."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from waltz_server.session_core import MAX_BATCH_RECORDS, SessionCore


def core(members=("a", "b", "c"), replicas=3, hwm=9, **kw) -> SessionCore:
    return SessionCore(members, replicas, hwm, **kw)


def queue(c: SessionCore, first: int, n: int, size: int = 10) -> None:
    for txid in range(first, first + n):
        c.queue(txid, b"x" * size, size - 4)


def test_a_batch_carries_everything_queued_since_the_last():
    c = core()
    queue(c, 10, 3)
    batch = c.next_batch(now=1.0)
    assert batch is not None and (batch.first, batch.last) == (10, 12)
    assert [s[0] for s in batch.spans] == [10, 11, 12]
    assert c.next_batch(now=1.0) is None  # nothing queued
    assert c.queued_records() == 3  # in flight


def test_a_batch_commits_on_a_majority_of_all_replicas_not_of_the_members():
    c = core(members=("a", "b"), replicas=3)  # two members of three replicas: both needed
    queue(c, 10, 1)
    batch = c.next_batch(1.0)
    assert c.acknowledged("a", batch) == []
    assert c.high_water_mark == 9
    assert c.acknowledged("b", batch) == [batch]
    assert c.high_water_mark == 10


def test_batches_commit_in_order_even_if_a_later_one_reaches_a_quorum_first():
    c = core(max_in_flight=4)
    queue(c, 10, 1)
    first = c.next_batch(1.0)
    queue(c, 11, 1)
    second = c.next_batch(1.0)
    c.acknowledged("a", first)
    # b and c answer the second first (they answer in order in reality, a fault here)
    assert c.acknowledged("b", second) == []
    assert c.acknowledged("c", second) == []
    assert c.acknowledged("b", first) == [first, second]
    assert c.high_water_mark == 11


def test_the_window_holds_at_most_max_in_flight_batches():
    c = core(max_in_flight=2)
    for txid in range(10, 13):
        queue(c, txid, 1)
        c.next_batch(1.0)
    assert len(c.in_flight) == 2 and not c.window_open
    assert c.has_queued
    first = c.in_flight[0]
    c.acknowledged("a", first)
    assert c.acknowledged("b", first) == [first]
    assert c.window_open
    assert c.next_batch(1.0).first == 12


def test_a_batch_respects_the_byte_and_record_limits():
    c = core(max_batch_bytes=100)
    queue(c, 10, 25, size=10)  # 250 bytes
    sizes = []
    while (batch := c.next_batch(1.0)) is not None:
        sizes.append(len(batch.buf))
        assert [s[1] for s in batch.spans] == list(range(0, len(batch.buf), 10))
    assert sizes == [100, 100, 50]
    big = core(max_batch_bytes=1 << 30, max_in_flight=100)
    queue(big, 0, MAX_BATCH_RECORDS + 5, size=5)
    assert len(big.next_batch(1.0).spans) == MAX_BATCH_RECORDS
    assert len(big.next_batch(1.0).spans) == 5


def test_a_record_larger_than_a_batch_goes_alone():
    c = core(max_batch_bytes=100)
    c.queue(10, b"y" * 500, 496)
    queue(c, 11, 1)
    assert len(c.next_batch(1.0).buf) == 500
    assert c.next_batch(1.0).first == 11


def test_a_failed_member_ends_the_session_and_later_answers_are_ignored():
    c = core()
    queue(c, 10, 1)
    batch = c.next_batch(1.0)
    assert c.failed("b", "connection closed")
    assert c.end_reason == "replica b: connection closed"
    assert not c.failed("c", "too")  # the first reason stays
    assert c.acknowledged("a", batch) == [] and c.acknowledged("c", batch) == []
    assert c.high_water_mark == 9
    assert c.next_batch(2.0) is None


def test_a_straggler_ends_the_session_after_the_timeout():
    c = core()
    queue(c, 10, 1)
    batch = c.next_batch(1.0)
    c.acknowledged("a", batch)
    c.acknowledged("b", batch)
    assert not c.check_stragglers(now=5.9, timeout=5.0)
    assert c.check_stragglers(now=6.5, timeout=5.0)
    assert c.end_reason == "replica c has not answered for 5.5 s"


def test_a_member_too_far_behind_ends_the_session_at_the_next_batch():
    c = core(max_in_flight=1)  # backlog bound: 8 batches unanswered
    for i in range(8):
        queue(c, 10 + i, 1)
        batch = c.next_batch(float(i))
        c.acknowledged("a", batch)
        assert c.acknowledged("b", batch) == [batch]  # committed without c
    queue(c, 18, 1)
    assert c.next_batch(9.0) is None
    assert c.end_reason == "replica c is not keeping up"


def test_a_member_too_far_behind_in_bytes_ends_the_session_before_the_count_does():
    c = core(max_in_flight=16, max_member_backlog_bytes=1000)  # count bound: 128 batches
    sent = 0
    queue(c, 10, 5, size=50)
    while (batch := c.next_batch(float(sent))) is not None:
        c.acknowledged("a", batch)
        c.acknowledged("b", batch)  # committed without c
        sent += 1
        queue(c, 10 + 5 * sent, 5, size=50)  # about 400 bytes a batch on the wire
    assert c.end_reason == "replica c is not keeping up"
    assert 2 <= sent <= 4  # 1000 bytes, not 128 batches
    assert c.members["c"].unacked_bytes >= 1000


def test_acknowledged_batches_no_longer_count_against_a_member():
    c = core(max_member_backlog_bytes=1000)
    for i in range(20):
        queue(c, 10 + i, 1, size=300)
        batch = c.next_batch(float(i))
        assert batch is not None, c.end_reason
        for member in "abc":
            c.acknowledged(member, batch)
    assert all(m.unacked_bytes == 0 for m in c.members.values())


def test_the_reader_is_the_usable_member_that_acknowledged_the_most():
    c = core()
    queue(c, 10, 1)
    first = c.next_batch(1.0)
    queue(c, 11, 1)
    second = c.next_batch(1.0)
    for m in ("a", "b"):
        c.acknowledged(m, first)
    c.acknowledged("b", second)
    assert c.reader(10) == "b"
    assert c.reader(10, usable=lambda a: a != "b") == "a"
    assert c.reader(11, usable=lambda a: a != "b") is None
    assert c.reader(9) == "b"


def test_backlogged_once_a_full_window_of_bytes_waits():
    c = core(max_batch_bytes=100, max_in_flight=2)  # backlog bound: 200 bytes queued
    queue(c, 10, 19, size=10)
    assert not c.backlogged
    queue(c, 29, 1, size=10)
    assert c.backlogged
    c.next_batch(1.0)
    assert not c.backlogged


@given(
    replicas=st.integers(1, 5),
    data=st.data(),
)
def test_commits_are_exactly_the_prefix_a_majority_acknowledged(replicas, data):
    """Members answer their batches in order, interleaved at random: the high-water mark
    is always the last batch of the longest prefix each of whose batches a majority of all
    replicas acknowledged, and commits come out in order, once each."""
    members = [f"m{i}" for i in range(data.draw(st.integers((replicas + 1) // 2, replicas)))]
    c = SessionCore(members, replicas, -1, max_in_flight=64)
    batches = []
    for txid in range(data.draw(st.integers(1, 12))):
        c.queue(txid, b"r", 0)
        batches.append(c.next_batch(0.0))
    answered = {m: 0 for m in members}
    committed = []
    quorum = replicas // 2 + 1
    while any(answered[m] < len(batches) for m in members):
        m = data.draw(st.sampled_from([m for m in members if answered[m] < len(batches)]))
        committed += c.acknowledged(m, batches[answered[m]])
        answered[m] += 1
        counts = sorted(answered.values(), reverse=True)
        expected = counts[quorum - 1] if len(counts) >= quorum else 0
        assert [b.last for b in committed] == list(range(expected))
        assert c.high_water_mark == expected - 1
