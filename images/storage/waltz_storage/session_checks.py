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
a stranger tried that very session just before, for ``REFUSAL_TTL``. A session the
metadata records is never remembered: an acceptance always comes from a read made for
that request or, when reads of the partition were under way, after them. Reads of one
partition do not overlap: a check that finds one under way waits for it, then decides
from what it left (single-flight).

A group of requests of many partitions with new sessions (a server that has just taken
a hundred partitions fences them all on each node) reads their metadata together first,
in one pipelined round trip (``read_ahead``), instead of one partition after another.
Such a read only ever accepts: a session at or below the one it found recorded.

``refused_from_memory`` is the decision; ``SessionChecks`` the thread-safe shell
(called from the node's I/O thread, or from the event loop's for small groups).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .metrics import StorageMetrics

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
    ) -> None:
        self._read = read
        self._read_many = read_many
        self._ttl = ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._refusals: dict[int, Refusal] = {}
        self._reading: dict[int, threading.Event] = {}  # partitions with a read under way
        self._changes: dict[int, int] = {}  # metadata changes seen, by partition
        self._checks = metrics.session_checks if metrics is not None else None
        self._remembered = metrics.session_refusals_remembered if metrics is not None else None

    def forget(self, partition_id: int) -> None:
        """The partition's metadata changed (a ZooKeeper watch): ask again next time.
        Any thread."""
        with self._lock:
            self._refusals.pop(partition_id, None)
            self._changes[partition_id] = self._changes.get(partition_id, 0) + 1

    def read_ahead(self, wanted: dict[int, int]) -> dict[int, int]:
        """The sessions the metadata records for partitions whose requests carry a newer
        session (``wanted``: partition -> that session), read in one round trip; for the
        caller to accept those sessions at or below them (``accepted_ahead``). Left out,
        to ask on their own: partitions refused from memory, and every one when there is
        no batch reader, fewer than two to read, or the read fails."""
        if self._read_many is None:
            return {}
        now = self._clock()
        with self._lock:
            ask = [
                partition_id
                for partition_id, session in wanted.items()
                if not refused_from_memory(
                    self._refusals.get(partition_id), session, now, self._ttl
                )
            ]
        if len(ask) < 2:
            return {}
        try:
            return self._read_many(ask)
        except Exception:  # each request asks on its own, and says why if it fails
            return {}

    def accepted_ahead(self) -> None:
        """A session accepted on ``read_ahead``'s word (counted as a check)."""
        self._count("recorded")

    def check(self, partition_id: int, session: int) -> str | None:
        """Why ``session`` may not be adopted for the partition, or None when the
        metadata records it (or a newer one)."""
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
