"""A store session's decisions, pure: batching, the window, acknowledgements and the
commit quorum, stragglers, and when the session ends.

The asyncio shell (``store_session.py``) sends each batch ``next_batch`` returns to
every member and reports each answer with ``acknowledged`` or ``failed``; it hands the
batches ``acknowledged`` says committed to the partition. Time is passed in; nothing
here does I/O, so tests (and the simulator) drive it event by event.

Rules (docs/server.md, "Sessions"):

- A batch holds the records queued since the last one, up to ``max_batch_bytes`` and
  ``MAX_BATCH_RECORDS``; up to ``max_in_flight`` batches are in flight.
- A batch commits when a majority of *all* the partition's replicas (not of the
  members) has acknowledged it; members acknowledge in order, so batches commit in
  order.
- A member that fails, leaves more than 8 x ``max_in_flight`` batches or more than
  ``max_member_backlog_bytes`` of them unanswered (they wait in its connection's send
  buffer, in the server's memory), or leaves one unanswered longer than the timeout,
  ends the session: a replica never rejoins a session it left.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from waltz_client.wire.storage_messages import DEFAULT_MAX_LIST_RECORDS

# Storage refuses an Append of more records than its list limit, however small they are.
MAX_BATCH_RECORDS = DEFAULT_MAX_LIST_RECORDS // 10


@dataclass
class Batch:
    first: int
    last: int
    buf: bytes
    spans: list[tuple[int, int, int]]  # (transaction ID, offset in buf, data length)
    started: float
    acked_by: set[str] = field(default_factory=set)


@dataclass
class MemberState:
    acked: int  # highest transaction ID it acknowledged in this session
    unacked: deque[float] = field(default_factory=deque)  # send times, oldest first
    unacked_sizes: deque[int] = field(default_factory=deque)  # their bytes, in order
    unacked_bytes: int = 0


class SessionCore:
    def __init__(
        self,
        members: Iterable[str],
        replica_count: int,
        high_water_mark: int,
        *,
        max_batch_bytes: int = 4 * 1024 * 1024,
        max_in_flight: int = 16,
        max_member_backlog_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self.members = {address: MemberState(high_water_mark) for address in members}
        self.quorum = replica_count // 2 + 1
        self.start_high_water_mark = high_water_mark
        self.high_water_mark = high_water_mark
        self.end_reason: str | None = None
        self.in_flight: deque[Batch] = deque()
        self.max_in_flight = max_in_flight
        self._max_batch_bytes = max_batch_bytes
        self._max_backlog_bytes = max_batch_bytes * max_in_flight
        self._max_member_backlog = 8 * max_in_flight
        self._max_member_backlog_bytes = max_member_backlog_bytes
        self._queued: list[bytes] = []
        self._queued_spans: list[tuple[int, int, int]] = []
        self._queued_bytes = 0

    # --- state ----------------------------------------------------------------------

    @property
    def ended(self) -> bool:
        return self.end_reason is not None

    @property
    def backlogged(self) -> bool:
        """Too much queued behind a full window: the append task should wait."""
        return self._queued_bytes >= self._max_backlog_bytes

    @property
    def has_queued(self) -> bool:
        return bool(self._queued)

    @property
    def window_open(self) -> bool:
        return len(self.in_flight) < self.max_in_flight

    def queued_records(self) -> int:
        return len(self._queued_spans) + sum(len(b.spans) for b in self.in_flight)

    def drained(self) -> bool:
        """Nothing queued and nothing in flight."""
        return not self._queued and not self.in_flight

    # --- events ---------------------------------------------------------------------

    def queue(self, transaction_id: int, wire_record: bytes, data_length: int) -> None:
        """One encoded wire record (the next transaction ID) for the next batch."""
        assert not self.ended, "queueing on an ended session"
        self._queued_spans.append((transaction_id, self._queued_bytes, data_length))
        self._queued.append(wire_record)
        self._queued_bytes += len(wire_record)

    def next_batch(self, now: float) -> Batch | None:
        """The batch to send to every member now, or None (nothing queued, the window is
        full, or the session ended; possibly just now, because a member fell too far
        behind)."""
        if self.ended or not self._queued or not self.window_open:
            return None
        for address, member in self.members.items():
            if (
                len(member.unacked) >= self._max_member_backlog
                or member.unacked_bytes >= self._max_member_backlog_bytes
            ):
                # A quorum keeps committing without it; its requests would pile up.
                self.end(f"replica {address} is not keeping up")
                return None
        buf, spans = self._take()
        batch = Batch(spans[0][0], spans[-1][0], buf, spans, now)
        self.in_flight.append(batch)
        for member in self.members.values():
            member.unacked.append(now)
            member.unacked_sizes.append(len(buf))
            member.unacked_bytes += len(buf)
        return batch

    def acknowledged(self, address: str, batch: Batch) -> list[Batch]:
        """``address`` acknowledged ``batch``; the batches that commit now, in order."""
        if self.ended:
            return []
        member = self.members[address]
        member.acked = batch.last
        if member.unacked:
            member.unacked.popleft()
            member.unacked_bytes -= member.unacked_sizes.popleft()
        batch.acked_by.add(address)
        committed = []
        while self.in_flight and len(self.in_flight[0].acked_by) >= self.quorum:
            done = self.in_flight.popleft()
            self.high_water_mark = done.last
            committed.append(done)
        return committed

    def failed(self, address: str, reason: str) -> bool:
        """A member failed (an error answer, a closed connection...): the session ends."""
        return self.end(f"replica {address}: {reason}")

    def end(self, reason: str) -> bool:
        """End the session; True if this call ended it."""
        if self.ended:
            return False
        self.end_reason = reason
        return True

    def check_stragglers(self, now: float, timeout: float) -> bool:
        """End the session if a member has left a request unanswered for ``timeout`` s
        (a paused or wedged storage node: the next session leaves it out)."""
        address = self.straggler(now, timeout)
        if address is None:
            return False
        waited = now - self.members[address].unacked[0]
        return self.end(f"replica {address} has not answered for {waited:.1f} s")

    def straggler(self, now: float, timeout: float) -> str | None:
        """A member that has left a request unanswered for ``timeout`` s, if any."""
        for address, member in self.members.items():
            if member.unacked and now - member.unacked[0] > timeout:
                return address
        return None

    def reader(self, up_to: int, usable: Callable[[str], bool] = lambda a: True) -> str | None:
        """A member that has acknowledged everything up to ``up_to`` (to read it back):
        the one that acknowledged the most."""
        best = None
        for address, member in self.members.items():
            better = best is None or member.acked > self.members[best].acked
            if member.acked >= up_to and better and usable(address):
                best = address
        return best

    # --- batching -------------------------------------------------------------------

    def _take(self) -> tuple[bytes, list[tuple[int, int, int]]]:
        if self._queued_bytes <= self._max_batch_bytes and len(self._queued) <= MAX_BATCH_RECORDS:
            buf, spans = b"".join(self._queued), self._queued_spans
            self._queued, self._queued_spans, self._queued_bytes = [], [], 0
            return buf, spans
        # Too much for one request: send a prefix, keep the rest queued.
        n, size = 0, 0
        while n < min(len(self._queued), MAX_BATCH_RECORDS) and (
            n == 0 or size + len(self._queued[n]) <= self._max_batch_bytes
        ):
            size += len(self._queued[n])
            n += 1
        buf = b"".join(self._queued[:n])
        spans = self._queued_spans[:n]
        self._queued = self._queued[n:]
        self._queued_spans = [(t, off - size, ln) for t, off, ln in self._queued_spans[n:]]
        self._queued_bytes -= size
        return buf, spans
