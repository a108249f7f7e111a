"""A store session: one session ID, a fixed set of member replicas, quorum commits.

The decisions (batching, the window, acknowledgements, the commit quorum, stragglers,
the end) are ``session_core.SessionCore``'s; this is the asyncio shell around it: one
writer task sends each batch as one storage Append to every member, several in flight,
and each answer goes back to the core, whose committed batches go to the partition.
Any member failing ends the session: a replica never rejoins a session it left, and
the partition starts a new session whose recovery decides what the old one committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from waltz_client.runtime.tasks import wait_for
from waltz_client.wire.errors import describe
from waltz_client.wire.framing import frame_parts
from waltz_client.wire.records import RecordBatch
from waltz_client.wire.storage_client import StorageClient, StorageFailure
from waltz_client.wire.storage_messages import (
    MESSAGE_HEADER,
    FailureResponse,
    StorageMessage,
    StorageMessageType,
)

from .commit_clock import NO_TIME
from .session_core import Batch, SessionCore
from .storage_pool import PoolKey, StoragePool

log = logging.getLogger(__name__)


class SessionEnded(Exception):
    """The store session failed or was closed; its reason says which."""


@dataclass
class Member:
    address: str
    client: StorageClient
    # Set when ``client`` is the server's shared connection to the node (storage_pool.py).
    shared: PoolKey | None = None

    @property
    def closed(self) -> bool:
        return self.client.closed


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
        max_member_backlog_bytes: int = 64 * 1024 * 1024,
        previous_writer: int = -1,
        pool: StoragePool | None = None,
    ) -> None:
        self.partition_id = partition_id
        self._pool = pool  # where shared members' connections go back to
        self.session_id = session_id
        self.members = members
        self._open_members = list(members.values())  # not yet closed or released
        self.replica_count = replica_count
        self.core = SessionCore(
            members,
            replica_count,
            high_water_mark,
            max_batch_bytes=max_batch_bytes,
            max_in_flight=max_in_flight,
            max_member_backlog_bytes=max_member_backlog_bytes,
        )
        self._on_commit = on_commit
        self._drained = asyncio.Event()
        self._drained.set()
        self._wake = asyncio.Event()
        self._committed = asyncio.Event()  # set by each commit and by the end: drain() waits
        self.ended = asyncio.get_running_loop().create_future()
        # Replicas recovery left out, far behind, with their clean positions: the
        # partition copies them in the background (catch_up.py).
        self.lagging: dict[str, int] = {}
        # Retention: the partition's log start when the session began (its metadata's).
        self.log_start = 0
        # The session that wrote last before this one (its recovery resolved it; -1:
        # none). The partition keeps its lock table when it ran that session itself.
        self.previous_writer = previous_writer
        # The commit time of the last committed transaction (recovery reads it; NO_TIME:
        # none): the partition's commit clock never stamps below it.
        self.last_commit_time = NO_TIME
        self._writer = asyncio.get_running_loop().create_task(self._write_loop())

    @property
    def quorum(self) -> int:
        return self.core.quorum

    @property
    def high_water_mark(self) -> int:
        return self.core.high_water_mark

    @property
    def start_high_water_mark(self) -> int:
        return self.core.start_high_water_mark

    @property
    def failed(self) -> bool:
        return self.ended.done()

    @property
    def live_replicas(self) -> int:
        return 0 if self.failed else len(self.members)

    def queued_records(self) -> int:
        return self.core.queued_records()

    @property
    def backlogged(self) -> bool:
        """Too much queued behind a full window: the append task should wait."""
        return self.core.backlogged

    async def wait_for_room(self) -> None:
        """Until the backlog is below its bound, or the session ended."""
        while self.backlogged and not self.ended.done():
            self._drained.clear()
            await self._drained.wait()

    def append(self, transaction_id: int, wire_record: bytes, data_length: int) -> None:
        """Queue one encoded wire record (the next transaction ID) for the next batch."""
        if self.ended.done():
            raise SessionEnded(str(self.ended.exception() or "session closed"))
        self.core.queue(transaction_id, wire_record, data_length)
        self._wake.set()

    def end(self, reason: str) -> None:
        self.core.end(reason)
        self._ended()

    def _ended(self) -> None:
        """Reflect the core's end: log it, fail ``ended``, wake whoever waits."""
        if self.core.end_reason is None or self.ended.done():
            return
        log.info(
            "partition %d: store session %d ends: %s",
            self.partition_id,
            self.session_id,
            self.core.end_reason,
        )
        self.ended.set_exception(SessionEnded(self.core.end_reason))
        self.ended.exception()  # retrieved: nobody has to await it
        self._wake.set()
        self._drained.set()
        self._committed.set()

    async def close(self, reason: str = "closed") -> None:
        self.end(reason)
        self._writer.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._writer
        # close() may run twice (a partition stopping while its loop closes the session):
        # a shared connection is released once, or it would close under other sessions.
        members, self._open_members = self._open_members, []
        await asyncio.gather(*(self._let_go(m) for m in members))

    async def _let_go(self, member: Member) -> None:
        if member.shared is not None and self._pool is not None:
            await self._pool.release(member.shared, member.client)
        else:
            await member.client.close()

    async def _write_loop(self) -> None:
        try:
            while not self.ended.done():
                batch = self.core.next_batch(asyncio.get_running_loop().time())
                self._ended()  # a member too far behind ends the session here
                if batch is None:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                if not self.backlogged:
                    self._drained.set()
                self._send(batch)
        except Exception as e:  # a bug here must not leave appends hanging
            log.exception("partition %d: store session writer failed", self.partition_id)
            self.end(f"writer failed: {describe(e)}")

    def _send(self, batch: Batch) -> None:
        count = len(batch.spans).to_bytes(4, "big")
        for member in self.members.values():
            seq = member.client.next_seq()
            # The records go to every member as they are: one buffer, not a copy each.
            parts = frame_parts(
                StorageMessageType.APPEND_REQUEST,
                MESSAGE_HEADER.pack(self.session_id, seq, self.partition_id) + count,
                batch.buf,
            )
            try:
                member.client.send_parts(
                    seq, parts, lambda r, e, m=member, b=batch: self._answered(m, b, r, e)
                )
            except ConnectionError as e:
                self._failed(member, describe(e), connection=True)
                return

    def _answered(
        self,
        member: Member,
        batch: Batch,
        response: StorageMessage | None,
        error: BaseException | None,
    ) -> None:
        if error is not None or response is None:
            self._failed(member, describe(error) if error else "no response", connection=True)
            return
        if isinstance(response, FailureResponse):
            self._failed(member, str(StorageFailure(response.error, response.message)))
            return
        committed = self.core.acknowledged(member.address, batch)
        if committed:
            self._wake.set()  # the window has room again
            self._committed.set()
        for done in committed:
            self._on_commit(RecordBatch(done.buf, done.spans), done.started)

    def _failed(self, member: Member, reason: str, *, connection: bool = False) -> None:
        """``connection``: the connection itself failed (closed, or silent too long), not
        one request: a shared one is closed so that no session goes on using it."""
        if connection and member.shared is not None and self._pool is not None:
            self._pool.discard(member.shared, member.client, reason)
        self.core.failed(member.address, reason)
        self._ended()

    async def drain(self, timeout: float) -> None:
        """Until every queued and in-flight record is committed (or the session ended, or
        ``timeout`` seconds): a planned end loses nothing."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.core.drained() and not self.ended.done():
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            self._committed.clear()
            with contextlib.suppress(TimeoutError):
                await wait_for(self._committed.wait(), remaining)

    async def ping(self, timeout: float) -> None:
        """An idle session's check that every member still answers (a cheap Max
        Transaction ID request): one that does not within ``timeout`` seconds (a dead or
        paused node, a cut link that sent no reset) ends the session, which the next
        leaves it out of, instead of the first append after a quiet spell finding out."""
        if self.ended.done() or not self.core.drained():
            return  # appends in flight: check_stragglers watches them

        async def one(member: Member) -> None:
            try:
                await wait_for(
                    member.client.max_transaction_id(self.session_id, self.partition_id),
                    timeout,
                )
            except TimeoutError:
                self._failed(member, f"did not answer a ping within {timeout:g} s", connection=True)
            except StorageFailure as e:
                self._failed(member, f"ping failed: {describe(e)}")
            except Exception as e:
                self._failed(member, f"ping failed: {describe(e)}", connection=True)

        await asyncio.gather(*(one(m) for m in self.members.values()))

    def check_stragglers(self, now: float, timeout: float) -> None:
        """End the session if a member has left a request unanswered for ``timeout`` s
        (a paused or wedged storage node: the next session leaves it out)."""
        address = self.core.straggler(now, timeout)
        if address is None:
            return
        member = self.members[address]
        if member.shared is not None and self._pool is not None:
            self._pool.discard(member.shared, member.client, f"silent for over {timeout:g} s")
        self.core.check_stragglers(now, timeout)
        self._ended()

    def reader(self, up_to: int) -> Member | None:
        """A member that has acknowledged everything up to ``up_to`` (to read it back)."""
        address = self.core.reader(up_to, lambda a: not self.members[a].closed)
        return self.members[address] if address is not None else None
