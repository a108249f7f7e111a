"""Refusals of newer sessions remembered for a moment (session_checks.py): the decision
on a clock the test moves, and the shell's single flight on real threads. The read is
the node's ZooKeeper read, replaced here by a function over a dict (the end-to-end
test with a real ZooKeeper is test_session_refusals.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable

from waltz_storage.metrics import StorageMetrics
from waltz_storage.session_checks import REFUSAL_TTL, Refusal, SessionChecks, refused_from_memory

HUGE = 2**63 - 1


def test_the_decision() -> None:
    refusal = Refusal(recorded=5, refused=HUGE, at=100.0)
    # Within the TTL: the session refused and any above it, and anything past R + 1.
    assert refused_from_memory(refusal, HUGE, 100.5, 1.0)
    assert refused_from_memory(refusal, 7, 100.5, 1.0)
    # R + 1, the owner's next session, and anything the metadata records: a new read.
    assert not refused_from_memory(refusal, 6, 100.5, 1.0)
    assert not refused_from_memory(refusal, 5, 100.5, 1.0)
    # R + 1 itself refused: remembered too.
    assert refused_from_memory(Refusal(5, 6, 100.0), 6, 100.5, 1.0)
    # Once the TTL is over, or with a clock that went back: a new read.
    assert not refused_from_memory(refusal, HUGE, 101.0, 1.0)
    assert not refused_from_memory(refusal, HUGE, 99.0, 1.0)
    assert not refused_from_memory(None, HUGE, 100.0, 1.0)


class Metadata:
    """What ZooKeeper records, read through a function that counts its calls."""

    def __init__(self, sessions: dict[int, int]) -> None:
        self.sessions = sessions
        self.reads = 0

    def read(self, partition_id: int) -> int:
        self.reads += 1
        return self.sessions[partition_id]


def checks_on(metadata: Metadata) -> tuple[SessionChecks, Callable[[float], None]]:
    now = [1000.0]

    def advance(seconds: float) -> None:
        now[0] += seconds

    return SessionChecks(metadata.read, StorageMetrics(), clock=lambda: now[0]), advance


def test_refusals_are_remembered_for_the_ttl_and_what_was_recorded_for_good() -> None:
    metadata = Metadata({0: 5, 1: 3})
    checks, advance = checks_on(metadata)
    assert "newer than the newest session the cluster metadata records (5)" in str(
        checks.check(0, HUGE)
    )
    for session in (HUGE, HUGE - 1, 1000, 7):
        assert checks.check(0, session) is not None
    assert metadata.reads == 1
    # Another partition has its own.
    assert checks.check(1, HUGE) is not None
    assert metadata.reads == 2
    # The owner records 6 and uses it: read again, adopted. What the read found is
    # remembered (a partition's recorded session only grows): 6 and below are accepted
    # without another read, a session above it is read for.
    metadata.sessions[0] = 6
    assert checks.check(0, 6) is None
    assert metadata.reads == 3
    assert checks.check(0, 6) is None and checks.check(0, 5) is None
    assert checks.known_recorded(0, 6) and not checks.known_recorded(0, 7)
    assert metadata.reads == 3
    # After the TTL the refusal is asked again.
    advance(REFUSAL_TTL)
    assert checks.check(0, HUGE) is not None
    assert metadata.reads == 4


def test_a_prefetch_answers_the_check_that_follows() -> None:
    """Requests with new sessions have their metadata read as they arrive: the check
    made when their group runs reads nothing, and one made while the prefetch is under
    way waits for it instead of reading the same again. A prefetch that fails leaves
    the check to read; a session above what it found is read for, and refused."""
    metadata = Metadata({0: 5, 1: 3, 2: 9})
    batches: list[list[int]] = []
    release = threading.Event()

    def read_many(partition_ids: list[int]) -> dict[int, int]:
        batches.append(sorted(partition_ids))
        release.wait(30)
        return {p: metadata.sessions[p] for p in partition_ids}

    # A wait longer than any busy machine's pause: the check below must wait for the
    # prefetch, however late this thread releases it.
    checks = SessionChecks(metadata.read, StorageMetrics(), read_many=read_many, prefetch_wait=60)
    prefetch = threading.Thread(target=checks.prefetch, args=({0: 5, 1: 4, 2: 9},))
    prefetch.start()
    while not batches:  # the prefetch is reading
        threading.Event().wait(0.01)
    answers: list[str | None] = []
    waiting = threading.Thread(target=lambda: answers.append(checks.check(2, 9)))
    waiting.start()
    waiting.join(0.2)
    assert waiting.is_alive() and metadata.reads == 0  # waits for the prefetch
    release.set()
    prefetch.join(30)
    waiting.join(30)
    assert answers == [None] and metadata.reads == 0
    assert checks.check(0, 5) is None and metadata.reads == 0
    assert checks.check(1, 4) is not None and metadata.reads == 1  # 3 recorded: refused
    # Known partitions are not read again, ahead or prefetched.
    assert checks.read_ahead({0: 5, 2: 9}) == {}
    checks.prefetch({0: 4, 2: 8})
    assert batches == [[0, 1, 2]]

    def broken(_ps: list[int]) -> dict[int, int]:
        raise TimeoutError("ZooKeeper did not answer")

    failing = SessionChecks(metadata.read, StorageMetrics(), read_many=broken)
    failing.prefetch({0: 5})
    assert not failing.known_recorded(0, 5)
    assert failing.check(0, 5) is None and metadata.reads == 2


def test_a_change_of_the_metadata_forgets_the_refusal() -> None:
    """A stranger tries the owner's next session first: refused and remembered. The watch
    on the metadata forgets it when the owner records that session, so the owner is
    not refused on the stranger's account."""
    metadata = Metadata({0: 5})
    checks, _ = checks_on(metadata)
    assert checks.check(0, 6) is not None
    assert checks.check(0, 6) is not None
    assert metadata.reads == 1
    metadata.sessions[0] = 6
    checks.forget(0)  # what the ZooKeeper watch calls
    assert checks.check(0, 6) is None
    assert metadata.reads == 2


def test_a_read_that_a_change_overtook_is_not_remembered() -> None:
    metadata = Metadata({0: 5})

    def read_then_changed(partition_id: int) -> int:
        recorded = metadata.read(partition_id)
        checks.forget(partition_id)  # the watch fired while the answer was on its way
        return recorded

    checks = SessionChecks(read_then_changed, StorageMetrics())
    assert checks.check(0, HUGE) is not None
    assert checks.check(0, HUGE) is not None
    assert metadata.reads == 2


def test_a_failed_read_refuses_and_is_not_remembered() -> None:
    calls = []

    def unreachable(partition_id: int) -> int:
        calls.append(partition_id)
        raise TimeoutError("ZooKeeper did not answer")

    checks = SessionChecks(unreachable, StorageMetrics())
    for _ in range(3):
        assert "ZooKeeper did not answer" in str(checks.check(0, 6))
    assert len(calls) == 3


def test_concurrent_checks_of_a_partition_share_one_read() -> None:
    """Single flight: 16 threads ask about sessions the metadata does not record while
    a read is under way; they wait for it and are refused on its word."""
    started = threading.Event()
    release = threading.Event()
    reads = []

    def slow_read(partition_id: int) -> int:
        reads.append(partition_id)
        started.set()
        assert release.wait(30)
        return 5

    checks = SessionChecks(slow_read, StorageMetrics())
    answers: list[str | None] = []
    first = threading.Thread(target=lambda: answers.append(checks.check(0, HUGE)))
    first.start()
    assert started.wait(30)
    others = [
        threading.Thread(target=lambda s=s: answers.append(checks.check(0, HUGE - s)))
        for s in range(16)
    ]
    for t in others:
        t.start()
    release.set()
    for t in [first, *others]:
        t.join(30)
    assert len(answers) == 17 and all(a is not None for a in answers)
    assert reads == [0]


def test_a_read_ahead_asks_for_many_partitions_at_once_but_not_for_refused_ones() -> None:
    metadata = Metadata({0: 5, 1: 3, 2: 9})
    batches: list[list[int]] = []

    def read_many(partition_ids: list[int]) -> dict[int, int]:
        batches.append(partition_ids)
        return {p: metadata.sessions[p] for p in partition_ids}

    now = [1000.0]
    checks = SessionChecks(
        metadata.read, StorageMetrics(), read_many=read_many, clock=lambda: now[0]
    )
    assert checks.check(0, HUGE) is not None  # remembered: refused for the TTL
    assert checks.read_ahead({0: HUGE, 1: 4, 2: 9}) == {1: 3, 2: 9}
    assert batches == [[1, 2]] and metadata.reads == 1
    # Fewer than two to read: each asks on its own.
    assert checks.read_ahead({0: HUGE, 1: 4}) == {}
    assert batches == [[1, 2]]
    # Without a batch reader, nothing ahead.
    assert SessionChecks(metadata.read, StorageMetrics()).read_ahead({1: 4, 2: 9}) == {}
