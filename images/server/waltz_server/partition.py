"""One owned partition: the append task, its commits and its feeds.

Appends, mounts and flushes go through one queue in arrival order. The
append task checks generation, connection staleness and locks, assigns the
next transaction ID, takes the locks (at assignment, so a second append
computed against the same state conflicts with the first even before it
commits; a failed append only leaves a lock looking newer, a false conflict,
never a missed one) and hands the record to the store session. Commits fill
the feed and data caches and wake the feeds. Mounts and flushes wait until
every append queued before them is resolved (committed, or lost with a
session) and are answered on the feed, after the transactions they cover. The
store sessions behind the partition (recovery, planned boundaries, catch-ups,
retention) are ``session_loop``'s; reads of committed transactions are
``storage_reads``'."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from waltz_client.cluster.retention import RetentionPolicy
from waltz_client.runtime.json_logs import log_context
from waltz_client.wire.client_messages import (
    AppendRequest,
    ErrorCode,
    ErrorResponse,
    FeedSuspended,
    FlushRequest,
    FlushResponse,
    LockFailure,
    MountRequest,
    MountResponse,
    MountStatus,
)
from waltz_client.wire.records import (
    CRC,
    FORMAT_2,
    RECORD_HEADER,
    RecordBatch,
    ReqId,
    UncheckedRecords,
    crc32,
)

from . import storage_reads
from .caches import DataCache, FeedCache
from .commit_clock import CommitClock, wall_clock_ms
from .feed import ClientConnection, Subscription
from .feed_slots import FeedSlots
from .partition_core import Ignored, LockConflict, PartitionCore, Resolved
from .recovery_manager import RecoveryContext
from .session_loop import SessionLoop
from .store_session import StoreSession

log = logging.getLogger(__name__)

_RECORD_HEAD = FORMAT_2.head  # the records this server writes: each with its commit time
# A feed's header of a committed record: its first 28 bytes, then its commit time.
_HEADER_END = RECORD_HEADER.size
_TIME_START, _TIME_END = FORMAT_2.head_size - 8, FORMAT_2.head_size
# Clocks further apart than this between owners are worth a warning (commit times stand
# still meanwhile).
CLOCK_AHEAD_WARNING_MS = 1000


class State(Enum):
    RECOVERING = "recovering"
    ACTIVE = "active"
    STOPPED = "stopped"


@dataclass(frozen=True)
class PartitionSettings:
    lock_table_size: int = 1 << 16
    lock_hashes: int = 3
    feed_cache_bytes: int = 16 * 1024 * 1024
    data_cache_bytes: int = 64 * 1024 * 1024
    max_queue: int = 10_000
    feed_batch: int = 2000
    checkpoint_interval: int = 1_000_000
    probe_interval: float = 2.0
    max_feeds: int = 10_000  # feeds and mounts of the partition at once (each commit wakes all)
    retention_interval: float = 60.0  # seconds between retention steps


@dataclass
class PartitionStats:
    appended: int = 0
    committed: int = 0
    lock_failures: int = 0
    ignored: int = 0
    sessions: int = 0


class Partition:
    def __init__(
        self,
        context: RecoveryContext,
        settings: PartitionSettings,
        on_superseded: Callable[[Partition, str], None] = lambda p, why: None,
        observe_commit: Callable[[float], None] = lambda seconds: None,
        retention_policy: Callable[[], RetentionPolicy] = RetentionPolicy,
        wall_clock: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.partition_id = context.partition_id
        self._wall_clock = wall_clock  # ms since the epoch: the commit clock's source
        self.settings = settings
        self._on_superseded = on_superseded
        self._observe_commit = observe_commit
        # Retention: the first transaction still served; nothing below it is read.
        self.log_start = 0
        self.state = State.RECOVERING
        self.status = "starting"
        self.core = PartitionCore(
            context.generation, settings.lock_table_size, settings.lock_hashes
        )
        self.feed_cache = FeedCache(settings.feed_cache_bytes)
        self.data_cache = DataCache(settings.data_cache_bytes)
        self.commit_clock = CommitClock()
        self.stats = PartitionStats()
        self.feed_sent = 0
        self._queue: deque[tuple[ClientConnection, object]] = deque()
        self._queue_ready = asyncio.Event()
        self._paused: dict[ClientConnection, None] = {}  # ordered: resumed in order
        self._active = asyncio.Event()
        # Ordered (a dict, not a set), so that feeds are woken in a deterministic order.
        self.subscriptions: dict[Subscription, None] = {}
        # The cap on feeds and mounts, queued Mounts included (feed_slots.py says why).
        self.slots = FeedSlots(settings.max_feeds)
        self._tasks: list[asyncio.Task] = []
        self.sessions = SessionLoop(
            self,
            context,
            self._committed,
            settings.probe_interval,
            settings.checkpoint_interval,
            settings.retention_interval,
            retention_policy,
        )

    # --- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        # The tasks copy the context now: every line they log names the partition.
        with log_context(partition=self.partition_id):
            self._tasks = [
                loop.create_task(self.sessions.run()),
                loop.create_task(self._append_loop()),
                loop.create_task(self.sessions.retention_loop()),
            ]

    async def stop(self, reason: str) -> None:
        if self.state == State.STOPPED:
            return
        session = self.sessions.session
        # The server stops it from its own task: what the stopping logs names it too.
        with log_context(
            partition=self.partition_id, session=session.session_id if session else None
        ):
            await self._stop(reason)

    async def _stop(self, reason: str) -> None:
        self.state = State.STOPPED
        self.status = f"stopped: {reason}"
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            # Python 3.11's wait_for can swallow a cancellation that meets its inner
            # call's result (recovery's storage calls use it): cancel until it ends.
            while not task.done():
                await asyncio.wait({task}, timeout=0.1)
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                task.result()
        await self.sessions.close(reason)
        for sub in list(self.subscriptions):
            sub.stop()
            sub.connection.feeds.discard(sub)
            if not sub.connection.closed:
                sub.connection.send(FeedSuspended(sub.req_id, reason).encode())
        self.subscriptions.clear()
        self.slots.clear()
        for conn in self._paused:
            conn.resume_reading()
        self._paused.clear()
        # Mounts and flushes still queued must not wait for an answer that never comes.
        for conn, message in self._queue:
            conn.feeds.discard(message)  # a queued Mount held its place
            if conn.closed:
                continue
            if isinstance(message, MountRequest):
                conn.send(MountResponse(message.req_id, MountStatus.NOT_OWNER).encode())
            elif isinstance(message, FlushRequest):
                conn.send(
                    ErrorResponse(
                        message.req_id, ErrorCode.NOT_OWNER, f"partition stopped: {reason}"
                    ).encode()
                )
        self._queue.clear()

    @property
    def generation(self) -> int:
        return self.core.generation

    @property
    def high_water_mark(self) -> int:
        return self.core.high_water_mark

    @property
    def queue_size(self) -> int:
        return len(self._queue)

    @property
    def healthy(self) -> bool:
        return self.state == State.ACTIVE

    @property
    def feed_batch(self) -> int:
        return self.settings.feed_batch

    # --- the session loop's side (``SessionOwner``) ----------------------------------

    @property
    def session(self) -> StoreSession | None:
        return self.sessions.session

    @property
    def context(self) -> RecoveryContext:
        return self.sessions.context

    @property
    def stopped(self) -> bool:
        return self.state == State.STOPPED

    def replica_positions(self) -> dict[str, tuple[bool, int | None]]:
        return self.sessions.replica_positions()

    def change_replicas(self, replicas: tuple[str, ...]) -> None:
        self.sessions.change_replicas(replicas)

    def recovering(self) -> None:
        self.state = State.RECOVERING
        self._active.clear()

    def hold_appends(self) -> None:
        self._active.clear()

    def superseded(self, reason: str) -> None:
        self._on_superseded(self, reason)

    def session_opened(self, session: StoreSession, keep_locks: bool) -> None:
        self.log_start = max(self.log_start, session.log_start)
        self.stats.sessions += 1
        resolved = self.core.session_opened(session.high_water_mark, keep_locks)
        ahead = self.commit_clock.raise_floor(session.last_commit_time, self._wall_clock())
        if ahead > CLOCK_AHEAD_WARNING_MS:
            log.warning(
                "partition %d: the last transaction committed at a time %.1f s ahead of "
                "this server's clock; commit times stay there until the clock catches up "
                "(is a server's clock wrong?)",
                self.partition_id,
                ahead / 1000,
            )
        self.feed_cache.reset(session.high_water_mark)
        self.data_cache.drop_above(session.high_water_mark)
        self.state = State.ACTIVE
        self.status = f"active in session {session.session_id}"
        self._active.set()
        self._answer(resolved)
        self._wake_feeds()

    def publish_log_start(self, log_start: int) -> None:
        if log_start <= self.log_start:
            return
        log.info(
            "partition %d: the log now starts at transaction %d (retention)",
            self.partition_id,
            log_start,
        )
        self.log_start = log_start
        self.data_cache.drop_below(log_start)
        for sub in list(self.subscriptions):
            sub.wake()  # a feed behind the new start ends (truncated_for)

    def truncated_for(self, txid: int) -> str | None:
        """Why ``txid`` can no longer be read (below the log start), or None."""
        if txid >= self.log_start:
            return None
        return (
            f"partition {self.partition_id}: transaction {txid} is below the log start "
            f"{self.log_start} (deleted by retention); the first available is {self.log_start}"
        )

    # --- the append task --------------------------------------------------------------

    def feed_refusal(self, connection: ClientConnection, message: object) -> str | None:
        """Why a Feed or Mount must be refused (this partition's cap), or None. A Mount
        let in holds its slot from now (``submit`` it next); a Feed takes one when
        ``subscribe`` follows."""
        if isinstance(message, MountRequest):
            if self.slots.mount_queued(message.req_id.client_id, connection):
                return None
        elif self.slots.room_for_feed():
            return None
        return (
            f"partition {self.partition_id} has {self.slots.used} feeds and mounts "
            f"(max_feeds_per_partition {self.slots.cap})"
        )

    def submit(self, connection: ClientConnection, message: object) -> None:
        """Queue an append, mount or flush; stop reading the connection while full."""
        self._queue.append((connection, message))
        self._queue_ready.set()
        if len(self._queue) >= self.settings.max_queue and connection not in self._paused:
            connection.pause_reading()
            self._paused[connection] = None

    async def _append_loop(self) -> None:
        while True:
            if not self._queue:
                self._queue_ready.clear()
                await self._queue_ready.wait()
                continue
            if (
                self.state != State.ACTIVE
                or not self._active.is_set()
                or self.session is None
                or self.session.failed
            ):
                if self.session is not None and self.session.failed:
                    self.state = State.RECOVERING  # the session loop starts a new session
                    self._active.clear()
                await self._active.wait()
                continue
            if self.session is not None and self.session.backlogged:
                await self.session.wait_for_room()  # storage is slow: let the queue fill
                continue
            connection, message = self._queue.popleft()
            if self._paused and len(self._queue) <= self.settings.max_queue // 2:
                for conn in self._paused:
                    conn.resume_reading()
                self._paused.clear()
            if connection.closed:
                continue
            try:
                if isinstance(message, AppendRequest):
                    self._append(connection, message)
                elif isinstance(message, MountRequest):
                    self._mount(connection, message)
                elif isinstance(message, FlushRequest):
                    self._flush(connection, message)
            except Exception:
                log.exception(
                    "partition %d: append task failed on %s",
                    self.partition_id,
                    type(message).__name__,
                )
            if len(self._queue) % 64 == 0:
                await asyncio.sleep(0)  # let commits and feeds run under a long burst

    def _append(self, connection: ClientConnection, m: AppendRequest) -> None:
        q = m.req_id
        decision = self.core.append(
            q,
            connection.mounted_seq(q.client_id, self.partition_id),
            m.client_high_water_mark,
            m.write_locks,
            m.read_locks,
            m.append_locks,
        )
        if isinstance(decision, Ignored):
            self.stats.ignored += 1
            return
        if isinstance(decision, LockConflict):
            self.stats.lock_failures += 1
            connection.send(LockFailure(q, decision.transaction_id).encode())
            return
        session = self.session
        assert session is not None
        txid = decision.transaction_id
        data = m.data
        commit_time = self.commit_clock.stamp(self._wall_clock())
        record = b"".join(
            (
                _RECORD_HEAD.pack(
                    txid,
                    q.client_id,
                    q.generation,
                    q.partition_id,
                    q.seq,
                    m.header,
                    len(data),
                    commit_time,
                ),
                data,
                CRC.pack(crc32(data)),
            )
        )
        session.append(txid, record, len(data))
        self.stats.appended += 1

    def _mount(self, connection: ClientConnection, m: MountRequest) -> None:
        q = m.req_id
        connection.feeds.discard(m)  # its place, held while queued, goes to its feed
        gone = self.truncated_for(m.client_high_water_mark + 1)
        if gone is not None:
            self.slots.mount_ran(q.client_id, connection, None)
            connection.send(ErrorResponse(q, ErrorCode.TRUNCATED, gone).encode())
            return
        sub = Subscription(self, connection, q, m.client_high_water_mark, mounted=True)
        status, previous = self.core.mount(
            q, m.connection_seq, connection, sub, MountResponse(q, MountStatus.READY).encode()
        )
        if status != MountStatus.READY:
            self.slots.mount_ran(q.client_id, connection, None)
            sub.stop()
            connection.send(MountResponse(q, status).encode())
            return
        connection.mark_mounted(q.client_id, self.partition_id, m.connection_seq)
        self.slots.mount_ran(q.client_id, connection, sub)  # the slot passes to the new feed
        if isinstance(previous, Subscription):  # the client's earlier mount of this partition
            self._drop(previous)
        self.subscriptions[sub] = None
        connection.feeds.add(sub)
        self._answer(self.core.resolve())

    def _flush(self, connection: ClientConnection, m: FlushRequest) -> None:
        """A Flush settles the client's appends only on its mount feed in this partition
        object, after the transactions it covers (``PartitionCore.flush`` says why)."""
        q = m.req_id
        if not self.core.flush(q, connection, q):
            connection.send(
                ErrorResponse(
                    q,
                    ErrorCode.NOT_MOUNTED,
                    f"partition {self.partition_id}: this connection has no current mount of "
                    f"client {q.client_id}; mount again",
                ).encode()
            )
            return
        self._answer(self.core.resolve())

    def _answer(self, resolved: list[Resolved], wake: bool = True) -> None:
        """Queue each resolved barrier's answer on its feed, behind what it covers
        (``wake``: False when the feeds are pushed next)."""
        for r in resolved:
            sub = r.feed
            assert isinstance(sub, Subscription)
            if isinstance(r.token, ReqId):  # a Flush
                frame = FlushResponse(r.token, self.high_water_mark).encode()
            else:
                frame = r.token
            sub.add_marker(r.through, frame, wake)

    # --- commits and feeds ------------------------------------------------------------

    def _committed(self, batch: RecordBatch, started: float) -> None:
        buf = batch.buf
        head = _TIME_END
        add_header, put_data = self.feed_cache.add, self.data_cache.put
        for txid, pos, length in batch.spans:
            add_header(txid, buf[pos : pos + _HEADER_END] + buf[pos + _TIME_START : pos + head])
            put_data(txid, buf[pos + head : pos + head + length])
        resolved = self.core.committed(batch.last_txid)
        self.stats.committed += len(batch.spans)
        self._observe_commit(asyncio.get_running_loop().time() - started)
        self._answer(resolved, wake=False)
        for sub in list(self.subscriptions):  # a feed that fails leaves the dict
            sub.push()

    def _wake_feeds(self) -> None:
        for sub in self.subscriptions:
            sub.wake()

    def subscribe(
        self, connection: ClientConnection, req_id: ReqId, client_hwm: int, mounted: bool = False
    ) -> Subscription:
        with log_context(partition=self.partition_id):  # the feed's task names it
            sub = Subscription(self, connection, req_id, client_hwm, mounted)
        self.subscriptions[sub] = None
        connection.feeds.add(sub)
        self.slots.feed_started(sub)
        return sub

    def _drop(self, sub: Subscription) -> None:
        sub.stop()
        self.subscriptions.pop(sub, None)
        sub.connection.feeds.discard(sub)
        self.core.feed_ended(sub)
        self.slots.feed_ended(sub)

    def end_truncated(self, sub: Subscription, reason: str) -> None:
        """A feed whose next transaction is below the log start: it can never go on."""
        self._drop(sub)
        if not sub.connection.closed:
            sub.connection.send(ErrorResponse(sub.req_id, ErrorCode.TRUNCATED, reason).encode())

    def end_subscription(self, sub: Subscription, reason: str) -> None:
        """A feed that cannot go on: unregister it (flushes stop being routed to it) and
        tell the client, who mounts again."""
        self.subscriptions.pop(sub, None)
        sub.connection.feeds.discard(sub)
        self.core.feed_ended(sub)
        self.slots.feed_ended(sub)
        if not sub.connection.closed:
            try:
                sub.connection.send(FeedSuspended(sub.req_id, reason).encode())
            except Exception as e:  # the connection is going away as well
                log.info("partition %d: could not suspend a feed: %s", self.partition_id, e)

    @property
    def mounted_clients(self) -> int:
        """Clients mounted here on an open connection (their newest mount is kept)."""
        return self.core.clients_tracked

    def disconnect(self, connection: ClientConnection) -> None:
        for sub in [s for s in self.subscriptions if s.connection is connection]:
            self._drop(sub)
        self._paused.pop(connection, None)
        self.core.connection_closed(connection)
        self.slots.connection_closed(connection)  # its Mounts still queued never run

    async def read_headers(self, start: int, stop: int) -> list[bytes]:
        return await storage_reads.read_headers(self, start, stop)

    async def transaction_data(self, txid: int) -> bytes:
        """Committed data of ``txid``. Raises LookupError (not committed) or RuntimeError."""
        return await storage_reads.transaction_data(self, txid)

    async def find_time(self, time_ms: int) -> tuple[int, int]:
        """The first committed transaction at or after ``time_ms`` and the high-water mark
        (``storage_reads.find_time``)."""
        return await storage_reads.find_time(self, time_ms)

    async def read_range(
        self, start: int, max_records: int, max_bytes: int
    ) -> RecordBatch | UncheckedRecords:
        """Committed records from ``start`` (``storage_reads.read_range``)."""
        return await storage_reads.read_range(self, start, max_records, max_bytes)
