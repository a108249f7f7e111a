"""Checks of a newer store session against the cluster metadata, refusals remembered.

A storage node adopts a store session newer than a partition's current one only once
the partition's metadata in ZooKeeper records it (``PartitionService._fence``). Each
check is a ZooKeeper sync and read, made while the node's requests wait: 20,000
requests at session 2^63-1 made 20,000 of them, and an append and a read of that
partition took 3.9 s instead of 0.02 s.

So a refusal is remembered per partition: "at time T the metadata recorded session R,
and session S was not it". For ``REFUSAL_TTL`` seconds after T, and until the metadata
changes (a ZooKeeper watch set by the read forgets it at once), a request of that
partition with a session at or above ``min(S, R + 2)`` is refused without asking
again. R + 1, the next session an owner records, is still asked about unless it was
itself refused, so the owner's new session is not refused from memory; at worst, when
a stranger tried that very session just before, for ``REFUSAL_TTL``. Reads of one
partition do not overlap: a check that finds one under way waits for it, then decides
from what it left (single-flight).

What a read found recorded is remembered too, and accepts without a read: a partition's
recorded session only grows, one at a time (a server records its session + 1 by
compare-and-set), so once the metadata recorded R, every session up to R is one it
recorded, and a read now would find R or more. Only acceptances come from that memory;
a session above it is read for.

A group of requests of many partitions with new sessions (a server that has just taken
a hundred partitions fences them all on each node) reads their metadata together first,
in one pipelined round trip (``read_ahead``), instead of one partition after another.
Such a read only ever accepts: a session at or below the one it found recorded. Better
still, the node asks as such requests arrive (``prefetch``, on a thread of its own),
while its I/O thread still writes and syncs the groups before them: a recovering
server's vote then waits for neither.

``refused_from_memory`` is the decision; ``SessionChecks`` the thread-safe shell
(called from the node's I/O thread, or from the event loop's for small groups).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from waltz_client.cluster.metadata import NO_SESSION

if TYPE_CHECKING:
    from .metrics import StorageMetrics

# At most how long a check waits for a prefetch of its partition before reading itself:
# a prefetch takes a round trip to ZooKeeper; one that takes longer (ZooKeeper stalled,
# up to its 10-s read timeout) must not add its wait to the check's own read.
PREFETCH_WAIT = 0.5

# How long a refusal is remembered: short, so a real owner that a stranger raced to
# its next session is refused for at most this long (the watch usually ends it sooner).
REFUSAL_TTL = 1.0

# The newest session the metadata records for a partition; blocking.
ReadSession = Callable[[int], int]
# The same for several partitions in one round trip; those it could not read left out.
ReadSessions = Callable[[list[int]], dict[int, int]]


@dataclass(frozen=True, slots=True)
class Refusal:
    """A read of a partition's metadata that refused a session."""

    recorded: int  # the newest session it recorded
    refused: int  # the lowest session refused on that read's word
    at: float  # when the read was made (monotonic seconds)


def refused_from_memory(refusal: Refusal | None, session: int, now: float, ttl: float) -> bool:
    """Is ``session`` refused on ``refusal``'s word, with no new read, at ``now``?"""
    if refusal is None or not refusal.at <= now < refusal.at + ttl:
        return False
    return session >= min(refusal.refused, refusal.recorded + 2)


def unrecorded_message(partition_id: int, session: int, recorded: int) -> str:
    return (
        f"partition {partition_id}: session {session} is newer than the newest session the "
        f"cluster metadata records ({recorded}); a server records a session before using it"
    )


class SessionChecks:
    """Whether a partition's newer session is recorded in the cluster metadata, with
    refusals remembered (see the module). Thread-safe."""

    def __init__(
        self,
        read: ReadSession,
        metrics: StorageMetrics | None = None,
        *,
        read_many: ReadSessions | None = None,
        ttl: float = REFUSAL_TTL,
        clock: Callable[[], float] = time.monotonic,
        prefetch_wait: float = PREFETCH_WAIT,
    ) -> None:
        self._read = read
        self._read_many = read_many
        self._ttl = ttl
        self._prefetch_wait = prefetch_wait
        self._clock = clock
        self._lock = threading.Lock()
        self._refusals: dict[int, Refusal] = {}
        self._reading: dict[int, threading.Event] = {}  # partitions with a read under way
        self._changes: dict[int, int] = {}  # metadata changes seen, by partition
        self._recorded: dict[int, int] = {}  # the newest session a read found, by partition
        self._prefetching: dict[int, threading.Event] = {}  # partitions a prefetch reads now
        self._checks = metrics.session_checks if metrics is not None else None
        self._remembered = metrics.session_refusals_remembered if metrics is not None else None

    def forget(self, partition_id: int) -> None:
        """The partition's metadata changed (a ZooKeeper watch): ask again next time.
        Any thread."""
        with self._lock:
            self._refusals.pop(partition_id, None)
            self._changes[partition_id] = self._changes.get(partition_id, 0) + 1

    def known_recorded(self, partition_id: int, session: int) -> bool:
        """Has a read found ``session`` (or a newer one) recorded? Then it is accepted
        without another. Any thread."""
        return self._recorded.get(partition_id, NO_SESSION) >= session

    def _remember(self, recorded: dict[int, int]) -> None:
        with self._lock:
            for partition_id, session in recorded.items():
                if session > self._recorded.get(partition_id, NO_SESSION):
                    self._recorded[partition_id] = session

    def _after_prefetches(self, partition_ids: Iterable[int]) -> None:
        """Wait for the prefetches reading any of ``partition_ids``: a check decides on
        what they found rather than reading the same again."""
        with self._lock:
            under_way = {self._prefetching.get(p) for p in partition_ids} - {None}
        for done in under_way:
            assert done is not None
            done.wait(self._prefetch_wait)

    def _to_ask(self, wanted: dict[int, int]) -> list[int]:
        """Of ``wanted``, the partitions worth a read: not known to record the session,
        not refused from memory."""
        self._after_prefetches(wanted)
        now = self._clock()
        with self._lock:
            return [
                partition_id
                for partition_id, session in wanted.items()
                if self._recorded.get(partition_id, NO_SESSION) < session
                and not refused_from_memory(
                    self._refusals.get(partition_id), session, now, self._ttl
                )
            ]

    def read_ahead(self, wanted: dict[int, int]) -> dict[int, int]:
        """The sessions the metadata records for partitions whose requests carry a newer
        session (``wanted``: partition -> that session), read in one round trip; for the
        caller to accept those sessions at or below them (``accepted_ahead``). Left out,
        to ask on their own (or be accepted from memory, ``known_recorded``): partitions
        known to record theirs, partitions refused from memory, and every one when there
        is no batch reader, fewer than two to read, or the read fails."""
        if self._read_many is None:
            return {}
        ask = self._to_ask(wanted)
        if len(ask) < 2:
            return {}
        try:
            recorded = self._read_many(ask)
        except Exception:  # each request asks on its own, and says why if it fails
            return {}
        self._remember(recorded)
        return recorded

    def prefetch(self, wanted: dict[int, int]) -> None:
        """Read, for ``known_recorded``, the sessions of partitions whose requests just
        arrived with a newer session (``wanted``: partition -> that session), before
        their group runs. Blocking, for a thread of its own; a failure leaves the
        group's own check to ask."""
        if self._read_many is None:
            return
        ask = self._to_ask(wanted)
        done = threading.Event()
        with self._lock:
            ask = [p for p in ask if p not in self._prefetching]
            for partition_id in ask:
                self._prefetching[partition_id] = done
        if not ask:
            return
        try:
            self._remember(self._read_many(ask))
        except Exception:
            pass
        finally:
            with self._lock:
                for partition_id in ask:
                    if self._prefetching.get(partition_id) is done:
                        del self._prefetching[partition_id]
            done.set()

    def accepted_ahead(self) -> None:
        """A session accepted on ``read_ahead``'s word (counted as a check)."""
        self._count("recorded")

    def check(self, partition_id: int, session: int) -> str | None:
        """Why ``session`` may not be adopted for the partition, or None when the
        metadata records it (or a newer one)."""
        self._after_prefetches((partition_id,))
        if self.known_recorded(partition_id, session):
            self._count("recorded")
            return None
        while True:
            with self._lock:
                refusal = self._refusals.get(partition_id)
                if refused_from_memory(refusal, session, self._clock(), self._ttl):
                    assert refusal is not None
                    if self._remembered is not None:
                        self._remembered.inc()
                    return unrecorded_message(partition_id, session, refusal.recorded)
                under_way = self._reading.get(partition_id)
                if under_way is None:
                    done = self._reading[partition_id] = threading.Event()
                    changes = self._changes.get(partition_id, 0)
                    break
            under_way.wait()  # then decide from what it left
        try:
            return self._read_and_decide(partition_id, session, changes)
        finally:
            with self._lock:
                del self._reading[partition_id]
            done.set()

    def _read_and_decide(self, partition_id: int, session: int, changes: int) -> str | None:
        at = self._clock()
        try:
            recorded = self._read(partition_id)
        except Exception as e:
            self._count("failed")
            return (
                f"partition {partition_id}: cannot check session {session} against the "
                f"cluster metadata ({type(e).__name__}: {e}); retry"
            )
        self._remember({partition_id: recorded})
        if session <= recorded:
            self._count("recorded")
            return None
        self._count("not_recorded")
        with self._lock:
            # Not from a read that a change (seen by the watch) may have overtaken.
            if self._changes.get(partition_id, 0) == changes:
                known = self._refusals.get(partition_id)
                lowest = session
                if known is not None and known.recorded == recorded:
                    lowest = min(lowest, known.refused)
                self._refusals[partition_id] = Refusal(recorded, lowest, at)
        return unrecorded_message(partition_id, session, recorded)

    def _count(self, result: str) -> None:
        if self._checks is not None:
            self._checks.labels(result).inc()
