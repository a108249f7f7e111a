"""A client connection to the server: handshake, frames, dispatch to partitions.

Appends, mounts and flushes are queued on their partition in arrival order;
feed requests subscribe; data, high-water mark and range reads are answered
by small tasks. A malformed frame closes this connection only. Reading stops
while a partition's queue is full (back pressure), while the socket's write
buffer is over its high-water mark (a peer that does not read its replies), and
while too many read tasks are in flight; feeds wait while the write buffer is
full (a slow reader only slows itself). Feeds and mounts per connection are
capped; the daemon-wide bounds (connections, deadlines, partial frames) are
``waltz_client.runtime.peer_limits``. The slot, the hello, the frames and the closing,
as every daemon's connections have them, are ``waltz_client.runtime.peer_connection``'s.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from dataclasses import dataclass

from kazoo.exceptions import KazooException

from waltz_client.cluster.access import OPEN_ACCESS, Access, AccessPolicy
from waltz_client.cluster.client_ids import ClientIdRefused
from waltz_client.cluster.errors import ClusterError
from waltz_client.runtime.json_logs import PEER, log_context, set_log_context
from waltz_client.runtime.peer_connection import ErrorKinds, PeerConnection
from waltz_client.runtime.peer_limits import PeerGuard, PeerLimits
from waltz_client.runtime.peer_warnings import PeerWarnings
from waltz_client.wire.client_messages import (
    SERVER_PROTOCOL_VERSIONS,
    AllocateClientIdRequest,
    AppendRequest,
    ClientIdAllocated,
    ClientMessage,
    ErrorCode,
    ErrorResponse,
    FeedRequest,
    FindTimeRequest,
    FindTimeResponse,
    FlushRequest,
    HighWaterMarkRequest,
    HighWaterMarkResponse,
    MountRequest,
    MountResponse,
    MountStatus,
    ReadRangeRequest,
    ReadRangeResponse,
    TransactionDataRequest,
    TransactionDataResponse,
    decode_client_request,
    record_format,
    records_in,
)
from waltz_client.wire.corked import CorkedWriter
from waltz_client.wire.errors import describe
from waltz_client.wire.framing import Service
from waltz_client.wire.records import DEFAULT_MAX_DATA_BYTES, ReqId

from .client_identity import (
    ACTS_AS_CLIENT,
    MAX_ALLOCATIONS_PER_CONNECTION,
    ClientBindings,
    ZooKeeperUnavailable,
    refusal,
    required_access,
)
from .partition import Partition, State

log = logging.getLogger(__name__)
peer_warnings = PeerWarnings(log)

# A read's reply is at most a storage node's response limit (8 MiB by default).
READ_REPLY_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_feeds: int = 1024  # feeds and mounts at once, per connection
    max_reads: int = 32  # read, data and high-water mark requests in flight
    max_read_bytes: int = 64 * 1024 * 1024  # their largest replies together
    first_frame_max_bytes: int = 64 * 1024  # of a frame before the first request is whole
    peer: PeerLimits = PeerLimits()  # noqa: RUF009 - frozen: one shared default is safe


class ClientConnectionHandler(PeerConnection):
    peer_warnings = peer_warnings
    log_name = "client connection"
    service = Service.SERVER
    protocol_versions = SERVER_PROTOCOL_VERSIONS
    errors = ErrorKinds(
        refused="connection_limit",
        late="timeout",
        bad_handshake="malformed",
        malformed="malformed",
        unauthorized="unauthorized",
    )
    __slots__ = (
        "_access",
        "_access_seen",
        "_allocations",
        "_allowed",
        "_backlog_drain",
        "_bindings",
        "_budget_stopped",
        "_held",
        "_max_data_bytes",
        "_mounted",
        "_on_close",
        "_out",
        "_partitions",
        "_pauses",
        "_proven",
        "_read_bytes_in_flight",
        "_read_limited",
        "_reads_in_flight",
        "_tasks",
        "_write_blocked",
        "_write_paused",
        "feeds",
        "limits",
        "partitions_touched",
    )

    def __init__(
        self,
        partitions: Callable[[int], Partition | None],
        max_frame_bytes: int,
        max_data_bytes: int,
        on_close: Callable[[ClientConnectionHandler], None],
        on_error: Callable[[str], None] = lambda kind: None,
        write_buffer_bytes: int = 4 * 1024 * 1024,
        guard: PeerGuard | None = None,
        limits: ConnectionLimits | None = None,
        bindings: ClientBindings | None = None,
        access: Callable[[], AccessPolicy | None] = lambda: OPEN_ACCESS,
    ) -> None:
        self.limits = limits or ConnectionLimits()
        super().__init__(
            guard or PeerGuard(self.limits.peer, "handshake"),
            on_error,
            write_buffer_bytes,
            max_frame_bytes,  # the first request's size is checked as it comes
        )
        # This connection's feeds and mounts (a queued Mount holds a place until it runs).
        self.feeds: set[object] = set()
        self._reads_in_flight = 0
        self._read_bytes_in_flight = 0
        self._read_limited = False
        self._write_blocked = False
        self._budget_stopped = False
        # The client IDs this connection was given (allocations answered) and, with
        # client certificates, the IDs its identity has proven, and the requests held
        # (in order) while one is checked or allocated.
        self._bindings = bindings
        self._proven: set[int] = set()
        self._allocations = 0
        self._held: collections.deque[ClientMessage] | None = None  # a deque while any
        # The cluster's access policy (it may change at any time; None: not read yet) and,
        # for the policy last seen, what this connection's identity may do per
        # (partition, access).
        self._access = access
        self._access_seen: AccessPolicy | None = None
        self._allowed: dict[tuple[int, Access], bool] = {}
        self._partitions = partitions
        self._max_data_bytes = max_data_bytes
        self._on_close = on_close
        self._out: CorkedWriter | None = None  # the transport, written once a loop turn
        self._mounted: dict[tuple[int, int], int] = {}  # (client, partition) -> connection seq
        self._pauses = 0  # reasons to stop taking requests
        self._backlog_drain: asyncio.Handle | None = None
        # While the socket takes no more: set when it does again (None: writable; an
        # Event holds a 760-byte deque, and most connections never fill their socket).
        self._write_paused: asyncio.Event | None = None
        self._tasks: set[asyncio.Task] = set()
        self.partitions_touched: set[int] = set()

    # --- what a partition needs --------------------------------------------------------

    def send(self, frame: bytes) -> None:
        """Sent with the other frames of this loop turn, in one system call."""
        if self._out is not None and not self._closed:
            self._out.write(frame)

    def send_parts(self, parts: list) -> None:
        """A frame as buffers written in turn: a range read's records are not copied."""
        if self._out is not None and not self._closed:
            self._out.writelines(parts)

    def pause_reading(self) -> None:
        self._pauses += 1
        self._update_reading()

    def resume_reading(self) -> None:
        self._pauses = max(0, self._pauses - 1)
        if self._pauses == 0 and self._backlog and self._backlog_drain is None:
            # Not here: a partition resumes its connections while iterating over them,
            # and dispatching may pause one again.
            self._backlog_drain = asyncio.get_running_loop().call_soon(self._work_through_backlog)
        self._update_reading()

    def _holds_reading(self) -> bool:
        return self._pauses > 0

    def _holds_frames(self) -> bool:
        return self._pauses > 0

    def _hold(self, reason: str, hold: bool) -> None:
        """Pause reading for one of this connection's own reasons (each counted once)."""
        if getattr(self, reason) == hold:
            return
        setattr(self, reason, hold)
        if hold:
            self.pause_reading()
        else:
            self.resume_reading()

    # --- what the daemon-wide guard needs ------------------------------------------------

    @property
    def reading_paused(self) -> bool:
        """Held by a reason to stop taking requests (a frame's deadline waits meanwhile)."""
        return self._pauses > 0

    def over_budget(self, over: bool) -> None:
        self._hold("_budget_stopped", over)

    @property
    def writable(self) -> bool:
        return self._write_paused is None

    async def drained(self) -> None:
        paused = self._write_paused
        if paused is not None:
            await paused.wait()

    def _writes_resumed(self) -> None:
        paused, self._write_paused = self._write_paused, None
        if paused is not None:
            paused.set()

    def mounted_seq(self, client_id: int, partition_id: int) -> int | None:
        return self._mounted.get((client_id, partition_id))

    def mark_mounted(self, client_id: int, partition_id: int, connection_seq: int) -> None:
        """The partition accepted a Mount with this client connection sequence number."""
        self._mounted[(client_id, partition_id)] = connection_seq

    # --- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self._transport is not None:
            self._out = CorkedWriter(self._transport)

    def data_received(self, data: bytes) -> None:
        # Each protocol callback sets the client's address for what it logs, and for the
        # tasks it starts (reads, client ID checks, feeds), which copy the context.
        token = PEER.set(self.peer)  # the hot path: no log_context object
        try:
            super().data_received(data)
        finally:
            PEER.reset(token)

    def connection_lost(self, exc: Exception | None) -> None:
        with log_context(peer=self.peer):
            self._connection_lost(exc)

    def _connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self._backlog_drain is not None:
            self._backlog_drain.cancel()
        self._out = None
        self._writes_resumed()
        for task in self._tasks:
            task.cancel()
        if self._admitted:
            self._on_close(self)

    def pause_writing(self) -> None:
        if self._write_paused is None:
            self._write_paused = asyncio.Event()
        self._hold("_write_blocked", True)  # replies pile up: stop taking requests

    def resume_writing(self) -> None:
        self._writes_resumed()
        self._hold("_write_blocked", False)

    def _may_take_frames(self) -> bool:
        """Before its first request a connection is a stranger: it holds a slot others
        may take, and no more than ``first_frame_max_bytes`` of a frame (a first request,
        a Mount or a read, is tiny). False: it was closed."""
        if self._ready:
            return True
        if self._backlog:
            self._become_ready()
            return True
        assert self._decoder is not None
        limit = self.limits.first_frame_max_bytes
        if self._decoder.buffered > limit:
            self._reject(
                f"FrameTooLarge: more than {limit} bytes of a first request (first_frame_max_bytes)"
            )
            return False
        return True

    def _work_through_backlog(self) -> None:
        """Take the frames received until reads or replies in flight, or a full partition
        queue, say stop."""
        self._backlog_drain = None
        token = PEER.set(self.peer)
        try:
            super()._work_through_backlog()
        finally:
            PEER.reset(token)

    def _take(self, message_type: int, body: bytes) -> None:
        self._admit(decode_client_request(message_type, body, self._max_data_bytes))

    def close(self) -> None:
        if self._out is not None:
            self._out.flush()  # what was sent goes before the close
        super().close()

    # --- client identity ----------------------------------------------------------------

    @property
    def client_ids_in_use(self) -> set[int]:
        """The client IDs this connection has proven its identity may use."""
        return self._proven

    def _admit(self, message: ClientMessage) -> None:
        """Dispatch, or hold (with everything after it, in order) while the connection's
        right to act as the message's client ID is checked, or a client ID allocated."""
        if self._held or self._unproven(message) or isinstance(message, AllocateClientIdRequest):
            if self._held is None:
                self._held = collections.deque()
            self._held.append(message)
            if len(self._held) == 1:
                self.pause_reading()
                task = asyncio.get_running_loop().create_task(self._prove_held())
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            return
        self._dispatch(message)

    def _unproven(self, message: ClientMessage) -> bool:
        return (
            self._bindings is not None
            and self.identity is not None
            and isinstance(message, ACTS_AS_CLIENT)
            and message.req_id.client_id not in self._proven
        )

    async def _prove_held(self) -> None:
        held = self._held
        assert held is not None
        try:
            await self._work_through_held(held)
        finally:
            if not held:
                self._held = None

    async def _work_through_held(self, held: collections.deque[ClientMessage]) -> None:
        try:
            while held and not self._closed:
                message = held[0]
                if isinstance(message, AllocateClientIdRequest):
                    held.popleft()
                    await self._allocate(message)
                    continue
                if self._unproven(message):
                    assert self._bindings is not None and self.identity is not None
                    client_id = message.req_id.client_id
                    why = await self._bindings.refusal(client_id, self.identity)
                    if why is not None:
                        self._on_error(self.errors.unauthorized)
                        self._error(message.req_id, ErrorCode.UNAUTHORIZED, why)
                        self._warn(
                            "closing",
                            f"identity {self.identity!r} may not use client ID {client_id}: {why}",
                        )
                        held.clear()
                        self.close()
                        return
                    self._proven.add(client_id)
                held.popleft()
                self._dispatch(message)
        except Exception as e:  # ZooKeeper unreachable: refuse rather than guess
            self._warn("closing", f"cannot check its client ID: {describe(e)}")
            held.clear()
            self.close()
            return
        self.resume_reading()

    async def _allocate(self, message: AllocateClientIdRequest) -> None:
        """Answer an AllocateClientId: a fresh ID, bound to this connection's identity on a
        mutual-TLS port (within its quota), or an error saying why not."""
        q = message.req_id
        if self._bindings is None:
            self._error(q, ErrorCode.BAD_REQUEST, "this server does not allocate client IDs")
            return
        if self._allocations >= MAX_ALLOCATIONS_PER_CONNECTION:
            self._on_error("limit")
            self._error(
                q,
                ErrorCode.LIMIT_EXCEEDED,
                f"this connection has asked for {self._allocations} client IDs (at most "
                f"{MAX_ALLOCATIONS_PER_CONNECTION} a connection)",
            )
            return
        try:
            client_id = await self._bindings.allocate(self.identity)
        except ClientIdRefused as e:
            self._allocations += 1
            self._on_error("limit")
            self._error(q, ErrorCode.LIMIT_EXCEEDED, str(e))
            return
        except (ZooKeeperUnavailable, ClusterError, KazooException) as e:
            # Not counted: the client asks again once the server reaches ZooKeeper.
            self._error(q, ErrorCode.NOT_READY, f"cannot allocate a client ID now: {describe(e)}")
            return
        self._allocations += 1
        if self.identity is not None:
            self._proven.add(client_id)  # bound to this identity just now
        self.send(ClientIdAllocated(q, client_id).encode())

    # --- dispatch -----------------------------------------------------------------------

    def _allows(self, policy: AccessPolicy, partition_id: int, access: Access) -> bool:
        if policy is not self._access_seen:
            self._access_seen = policy
            self._allowed.clear()
        key = (partition_id, access)
        allowed = self._allowed.get(key)
        if allowed is None:
            allowed = policy.allows(self.identity, partition_id, access)
            if len(self._allowed) < 65536:
                self._allowed[key] = allowed
        return allowed

    def _dispatch(self, message: ClientMessage) -> None:
        q = message.req_id
        access = required_access(message)
        policy = self._access()
        if policy is None:
            self._not_ready(message)
            return
        if not self._allows(policy, q.partition_id, access):
            self._on_error("forbidden")
            self._error(q, ErrorCode.FORBIDDEN, refusal(self.identity, q.partition_id, access))
            return
        partition = self._partitions(q.partition_id)
        if partition is not None:
            self.partitions_touched.add(q.partition_id)
        match message:
            case AppendRequest():
                if partition is not None:
                    partition.submit(self, message)
                # else: not ours (any more); the client learns it from its mount
            case MountRequest():
                if partition is None:
                    self.send(MountResponse(q, MountStatus.NOT_OWNER).encode())
                    return
                if self._feeds_full(q, partition, message):
                    return
                self.feeds.add(message)  # holds its place while queued
                partition.submit(self, message)
            case FlushRequest():
                if partition is None:
                    self._error(q, ErrorCode.NOT_OWNER, "this server does not own the partition")
                else:
                    partition.submit(self, message)
            case FeedRequest():
                if partition is None:
                    self._error(q, ErrorCode.NOT_OWNER, "this server does not own the partition")
                elif not self._feeds_full(q, partition, message):
                    partition.subscribe(self, q, message.client_high_water_mark)
            case (
                TransactionDataRequest()
                | HighWaterMarkRequest()
                | ReadRangeRequest()
                | FindTimeRequest()
            ):
                self._start_read(partition, message)

    def _not_ready(self, message: ClientMessage) -> None:
        """The server has not read the access policy yet (it is starting): nobody is
        refused on a policy not yet known; the client is told to retry (NOT_READY). An
        append is dropped, as one for a partition not owned here: it cannot follow a
        Mount on this connection, and the client's next Mount settles it."""
        self._on_error("not_ready")
        if not isinstance(message, AppendRequest):
            self._error(
                message.req_id,
                ErrorCode.NOT_READY,
                "the server is starting: it has not read the cluster's access policy yet",
            )

    def _feeds_full(self, q: ReqId, partition: Partition, message: ClientMessage) -> bool:
        """Refuse (and say which limit) a feed or mount beyond this connection's or the
        partition's cap: each costs a task, and every commit wakes them all. A Mount let
        in holds its partition slot from here, while it waits in the queue."""
        if len(self.feeds) >= self.limits.max_feeds:
            why = f"this connection has {len(self.feeds)} feeds and mounts (max_feeds)"
        else:
            refusal = partition.feed_refusal(self, message)
            if refusal is None:
                return False
            why = refusal
        self._on_error("limit")
        self._error(q, ErrorCode.LIMIT_EXCEEDED, why)
        return True

    def _start_read(self, partition: Partition | None, message: ClientMessage) -> None:
        """Run a read as a task, counting its largest reply; stop reading requests while
        too many, or too many bytes of replies, are in flight."""
        if isinstance(message, ReadRangeRequest):
            size = min(max(message.max_bytes, 0), READ_REPLY_BYTES)
        elif isinstance(message, TransactionDataRequest):
            size = self._max_data_bytes
        else:
            size = 64
        self._reads_in_flight += 1
        self._read_bytes_in_flight += size
        self._limit_reads()
        task = asyncio.get_running_loop().create_task(self._rpc(partition, message))
        self._tasks.add(task)

        def done(t: asyncio.Task) -> None:
            self._tasks.discard(t)
            self._reads_in_flight -= 1
            self._read_bytes_in_flight -= size
            self._limit_reads()

        task.add_done_callback(done)

    def _limit_reads(self) -> None:
        limits = self.limits
        self._hold(
            "_read_limited",
            self._reads_in_flight >= limits.max_reads
            or self._read_bytes_in_flight >= limits.max_read_bytes,
        )

    def _error(self, q: ReqId, code: ErrorCode, text: str) -> None:
        self.send(ErrorResponse(q, code, text).encode())

    async def _rpc(self, partition: Partition | None, message: ClientMessage) -> None:
        q = message.req_id
        set_log_context(partition=q.partition_id)  # this task's own context
        if partition is None:
            self._error(q, ErrorCode.NOT_OWNER, f"partition {q.partition_id} is not owned here")
            return
        if partition.state != State.ACTIVE:
            self._error(q, ErrorCode.NOT_READY, f"partition {q.partition_id}: {partition.status}")
            return
        first = _first_transaction(message)
        gone = partition.truncated_for(first) if first is not None else None
        if gone is not None:
            self._error(q, ErrorCode.TRUNCATED, gone)
            return
        try:
            match message:
                case HighWaterMarkRequest():
                    self.send(HighWaterMarkResponse(q, partition.high_water_mark).encode())
                case FindTimeRequest(timestamp=time_ms):
                    found, hwm = await partition.find_time(time_ms)
                    self.send(FindTimeResponse(q, found, hwm).encode())
                case TransactionDataRequest(transaction_id=txid):
                    try:
                        data = await partition.transaction_data(txid)
                    except LookupError as e:
                        self.send(TransactionDataResponse(q, txid, None, str(e)).encode())
                        return
                    self.send(TransactionDataResponse(q, txid, data).encode())
                case ReadRangeRequest():
                    hwm = partition.high_water_mark
                    batch = await partition.read_range(
                        message.from_transaction_id, message.max_records, message.max_bytes
                    )
                    # Relayed as read for a client of this version (format 2); checked and
                    # converted for an older one (format 1: no commit times).
                    bound = max(self._max_data_bytes, DEFAULT_MAX_DATA_BYTES)
                    batch = records_in(batch, record_format(self.version), bound)
                    self.send_parts(ReadRangeResponse(q, hwm, batch).encode_parts())
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.info(
                "partition %d: %s failed: %s", q.partition_id, type(message).__name__, describe(e)
            )
            self._error(q, ErrorCode.STORAGE_UNAVAILABLE, describe(e))


def _first_transaction(message: ClientMessage) -> int | None:
    """The first transaction a read asks for."""
    if isinstance(message, TransactionDataRequest):
        return message.transaction_id
    if isinstance(message, ReadRangeRequest):
        return message.from_transaction_id
    return None
