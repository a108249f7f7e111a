"""A store session: one session ID, a fixed set of member replicas, quorum commits.

Records queued by the partition's append task are batched: one storage
Append per member carries every record queued since the last send, and
several batches may be in flight. A batch commits when a majority of the
partition's replicas (not of the members) has acknowledged it; replicas
acknowledge in order, so batches commit in order. Any member failing ends
the session: a replica never rejoins a session it left, and the partition
starts a new session whose recovery decides what the old one committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from waltz_client.wire.errors import describe
from waltz_client.wire.framing import encode_frame
from waltz_client.wire.records import RecordBatch
from waltz_client.wire.storage_client import StorageClient, StorageFailure
from waltz_client.wire.storage_messages import (
    DEFAULT_MAX_LIST_RECORDS,
    MESSAGE_HEADER,
    FailureResponse,
    StorageMessageType,
)

log = logging.getLogger(__name__)

# Storage refuses an Append of more records than its list limit, however small they are.
MAX_BATCH_RECORDS = DEFAULT_MAX_LIST_RECORDS // 10


class SessionEnded(Exception):
    """The store session failed or was closed; its reason says which."""


@dataclass
class Member:
    address: str
    client: StorageClient
    acked: int  # highest transaction ID this replica acknowledged in this session
    unacked: deque[float] = field(default_factory=deque)  # send times, oldest first


@dataclass
class _Batch:
    first: int
    last: int
    buf: bytes
    spans: list[tuple[int, int, int]]
    started: float
    acks: int = 0
    acked_by: set[str] = field(default_factory=set)


class StoreSession:
    def __init__(
        self,
        partition_id: int,
        session_id: int,
        members: dict[str, Member],
        replica_count: int,
        high_water_mark: int,
        on_commit: Callable[[RecordBatch, float], None],
        *,
        max_batch_bytes: int = 4 * 1024 * 1024,
        max_in_flight: int = 16,
    ) -> None:
        self.partition_id = partition_id
        self.session_id = session_id
        self.members = members
        self.replica_count = replica_count
        self.quorum = replica_count // 2 + 1
        self.start_high_water_mark = high_water_mark
        self.high_water_mark = high_water_mark
        self._on_commit = on_commit
        self._max_batch_bytes = max_batch_bytes
        self._queued: list[bytes] = []
        self._queued_spans: list[tuple[int, int, int]] = []
        self._queued_bytes = 0
        self._max_backlog_bytes = max_batch_bytes * max_in_flight
        self._max_member_backlog = 8 * max_in_flight
        self._drained = asyncio.Event()
        self._drained.set()
        self._in_flight: deque[_Batch] = deque()
        self._window = asyncio.Semaphore(max_in_flight)
        self._wake = asyncio.Event()
        self.ended = asyncio.get_running_loop().create_future()
        # Replicas recovery left out, far behind, with their clean positions: the
        # partition copies them in the background (catch_up.py).
        self.lagging: dict[str, int] = {}
        self._writer = asyncio.get_running_loop().create_task(self._write_loop())

    @property
    def failed(self) -> bool:
        return self.ended.done()

    @property
    def live_replicas(self) -> int:
        return 0 if self.failed else len(self.members)

    def queued_records(self) -> int:
        return len(self._queued_spans) + sum(len(b.spans) for b in self._in_flight)

    @property
    def backlogged(self) -> bool:
        """Too much queued behind a full window: the append task should wait."""
        return self._queued_bytes >= self._max_backlog_bytes

    async def wait_for_room(self) -> None:
        """Until the backlog is below its bound, or the session ended."""
        while self.backlogged and not self.ended.done():
            self._drained.clear()
            await self._drained.wait()

    def append(self, transaction_id: int, wire_record: bytes, data_length: int) -> None:
        """Queue one encoded wire record (the next transaction ID) for the next batch."""
        if self.ended.done():
            raise SessionEnded(str(self.ended.exception() or "session closed"))
        self._queued_spans.append((transaction_id, self._queued_bytes, data_length))
        self._queued.append(wire_record)
        self._queued_bytes += len(wire_record)
        self._wake.set()

    def end(self, reason: str) -> None:
        if not self.ended.done():
            log.info(
                "partition %d: store session %d ends: %s",
                self.partition_id,
                self.session_id,
                reason,
            )
            self.ended.set_exception(SessionEnded(reason))
            self.ended.exception()  # retrieved: nobody has to await it
            self._wake.set()
            self._drained.set()

    async def close(self, reason: str = "closed") -> None:
        self.end(reason)
        self._writer.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._writer
        await asyncio.gather(*(m.client.close() for m in self.members.values()))

    async def _write_loop(self) -> None:
        try:
            while not self.ended.done():
                if not self._queued:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                await self._window.acquire()
                if self.ended.done():
                    return
                self._send_batch()
        except Exception as e:  # a bug here must not leave appends hanging
            log.exception("partition %d: store session writer failed", self.partition_id)
            self.end(f"writer failed: {describe(e)}")

    def _take_batch(self) -> tuple[bytes, list[tuple[int, int, int]]]:
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

    def _send_batch(self) -> None:
        buf, spans = self._take_batch()
        if not self.backlogged:
            self._drained.set()
        batch = _Batch(spans[0][0], spans[-1][0], buf, spans, time.perf_counter())
        self._in_flight.append(batch)
        body = len(spans).to_bytes(4, "big") + buf
        for member in self.members.values():
            seq = member.client.next_seq()
            frame = encode_frame(
                StorageMessageType.APPEND_REQUEST,
                MESSAGE_HEADER.pack(self.session_id, seq, self.partition_id) + body,
            )
            try:
                future = member.client.submit_frame(seq, frame)
            except ConnectionError as e:
                self.end(f"replica {member.address}: {describe(e)}")
                return
            member.unacked.append(batch.started)
            if len(member.unacked) > self._max_member_backlog:
                # A quorum keeps committing without it; its requests would pile up.
                self.end(f"replica {member.address} is not keeping up")
                return
            future.add_done_callback(lambda f, m=member, b=batch: self._acknowledged(m, b, f))

    def _acknowledged(self, member: Member, batch: _Batch, future: asyncio.Future) -> None:
        if not future.cancelled():
            future.exception()  # retrieved, whatever happens next
        if self.ended.done():
            return
        if future.cancelled():
            self.end(f"replica {member.address}: request cancelled")
            return
        error = future.exception()
        if error is not None:
            self.end(f"replica {member.address}: {describe(error)}")
            return
        response = future.result()
        if isinstance(response, FailureResponse):
            self.end(
                f"replica {member.address}: {StorageFailure(response.error, response.message)}"
            )
            return
        member.acked = batch.last
        if member.unacked:
            member.unacked.popleft()
        batch.acks += 1
        while self._in_flight and self._in_flight[0].acks >= self.quorum:
            done = self._in_flight.popleft()
            self.high_water_mark = done.last
            self._window.release()
            self._on_commit(RecordBatch(done.buf, done.spans), done.started)

    async def drain(self, timeout: float) -> None:
        """Until every queued and in-flight record is committed (or the session ended, or
        ``timeout`` seconds): a planned end loses nothing."""
        deadline = asyncio.get_running_loop().time() + timeout
        while (
            (self._queued or self._in_flight)
            and not self.ended.done()
            and asyncio.get_running_loop().time() < deadline
        ):
            await asyncio.sleep(0.005)

    def check_stragglers(self, now: float, timeout: float) -> None:
        """End the session if a member has left a request unanswered for ``timeout`` s
        (a paused or wedged storage node: the next session leaves it out)."""
        for m in self.members.values():
            if m.unacked and now - m.unacked[0] > timeout:
                self.end(f"replica {m.address} has not answered for {now - m.unacked[0]:.1f} s")
                return

    def reader(self, up_to: int) -> Member | None:
        """A member that has acknowledged everything up to ``up_to`` (to read it back)."""
        best = None
        for m in self.members.values():
            if m.acked >= up_to and not m.client.closed and (best is None or m.acked > best.acked):
                best = m
        return best
