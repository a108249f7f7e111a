"""The storage node's asyncio TCP server: connections, the node's worker, back pressure.

Each connection decodes frames as they arrive and queues each partition request
on the node's worker. The worker drains its queue, hands the group (of any
partitions) to ``StorageNode.process_group`` on the node's I/O thread (file I/O
and fsync never block the event loop) and writes the responses back in order. A connection
stops reading its socket while it has too many requests (or bytes) queued, while its
unsent responses exceed a limit (a peer that does not read), or while the frames
partly received on all connections together exceed a budget; frames it has already
received wait, undispatched, until it reads again.

Bounds against a hostile or broken peer (``waltz_client.runtime.peer_limits``): a connection
cap and a cap per address, counted from accept, before the TLS handshake; a
connection not yet opened gives up its slot to a newcomer at either cap, so strangers
cannot lock servers out; small frames until Open has checked the cluster key; a
deadline for the TLS handshake, the hello and Open; a deadline for finishing a frame
once it has started (slow-loris); a failed Open on an opened connection closes it. A
queued read counts as the largest response it may produce, so unread replies cannot
pile up. The slot, the hello, the frames and the closing, as every daemon's connections
have them, are ``waltz_client.runtime.peer_connection``'s.

A peer of a protocol version before ``COMMIT_TIME_VERSION`` (a server not yet upgraded)
sends and takes records in format 1, without commit times: its requests are converted
to this build's format as they are decoded, and every response to it back to format 1
as it is sent (``in_record_format``); a peer of the current version costs nothing extra.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from dataclasses import dataclass, replace
from typing import Any

from waltz_client.runtime.json_logs import PEER, log_context
from waltz_client.runtime.listener import listen
from waltz_client.runtime.peer_connection import ErrorKinds, PeerConnection
from waltz_client.runtime.peer_limits import PeerGuard, PeerLimits
from waltz_client.runtime.peer_warnings import PeerWarnings
from waltz_client.runtime.tls import TlsContexts, identity_allowed
from waltz_client.wire.corked import write_buffers
from waltz_client.wire.framing import DEFAULT_MAX_FRAME_BYTES, Service
from waltz_client.wire.records import DEFAULT_FORMAT, FORMAT_1
from waltz_client.wire.storage_messages import (
    COMMIT_TIME_VERSION,
    DEFAULT_LIMITS,
    STORAGE_PROTOCOL_VERSIONS,
    FailureResponse,
    Limits,
    OpenRequest,
    RecordHeaderListRequest,
    RecordListRequest,
    RecordRequest,
    StorageError,
    StorageMessage,
    decode_request,
    in_record_format,
    record_format,
)

from .io_thread import IoThread
from .service import PartitionService, StorageNode

log = logging.getLogger(__name__)
peer_warnings = PeerWarnings(log)

# Requests whose response may be as large as the node's max_response_bytes.
_READS = (RecordListRequest, RecordHeaderListRequest, RecordRequest)


@dataclass(frozen=True, slots=True)
class ServerSettings:
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    limits: Limits = DEFAULT_LIMITS
    queue_max_requests: int = 1024  # per connection, before it stops reading
    queue_max_bytes: int = 64 * 1024 * 1024
    # All connections together: past it, a connection that queues more stops reading.
    node_queue_max_bytes: int = 512 * 1024 * 1024
    write_group_max_bytes: int = 8 * 1024 * 1024  # requests one worker hands over at once
    # A group of writes runs on the loop's thread while the last took at most this long.
    inline_group_max_seconds: float = 0.005
    unopened_max_frame_bytes: int = 64 * 1024  # before Open checked the cluster key
    write_buffer_max_bytes: int = 16 * 1024 * 1024  # unsent responses, per connection
    # connections, deadlines, partial-frame budget (frozen: one shared default is safe)
    peer: PeerLimits = PeerLimits()  # noqa: RUF009
    tls: TlsContexts | None = None  # serve over TLS (mutual, with a CA)
    allowed_peers: tuple[str, ...] = ("*",)  # with TLS: certificate identities let in


# Larger groups go to the I/O thread: their writes alone dwarf the hand-over, and the
# loop, not blocked for their whole write and sync, decodes the next requests meanwhile.
INLINE_GROUP_MAX_BYTES = 1024 * 1024


def runs_inline(
    requests: list[tuple[PartitionService, StorageMessage]],
    group_bytes: int,
    last_group_seconds: float,
    inline_max_seconds: float,
) -> bool:
    """Whether a group runs on the event loop's own thread rather than the I/O thread.

    Handing a group to the I/O thread and back costs two thread wakes and the GIL going
    back and forth, more than a small group's writes and sync on a fast disk (measured:
    docs/benchmarks.md). Inline, the loop is blocked meanwhile, so only for a small
    group (``INLINE_GROUP_MAX_BYTES``), while the disk is fast (the last group took at
    most ``inline_max_seconds``), and never for range reads, whose replies may be large
    and cold. ``inline_max_seconds`` 0: never."""
    if inline_max_seconds <= 0 or last_group_seconds > inline_max_seconds:
        return False
    if group_bytes > INLINE_GROUP_MAX_BYTES:
        return False
    return not any(isinstance(request, _READS) for _, request in requests)


class NodeWorker:
    """Runs every partition's requests a drained group at a time: each partition's in
    arrival order, and one sync for all the partitions that appended
    (``StorageNode.process_group``). A group runs on the node's one I/O thread, or on the
    loop's own thread while the disk is fast (``runs_inline``). While a group is on the
    I/O thread, the next gathers, so the busier the node, the larger its groups."""

    def __init__(
        self, node: StorageNode, group_max_bytes: int, inline_max_seconds: float = 0.0
    ) -> None:
        self.node = node
        self._io = IoThread("waltz-storage-io")
        self._group_max_bytes = group_max_bytes
        self._inline_max_seconds = inline_max_seconds
        self._last_group_seconds = 0.0  # wall time of the last group, either way
        self.inline_groups = 0  # groups run on the loop's thread (tests read it)
        self._queue: collections.deque[
            tuple[StorageConnection, PartitionService, StorageMessage, int]
        ] = collections.deque()
        self._wakeup = asyncio.Event()
        self._stopping = False
        self._queued = 0  # requests ever queued
        self._answered = 0  # requests ever answered
        self._progress = asyncio.Event()  # set after each group
        # Partitions whose requests just came with a newer session, read for at the end of
        # this turn of the loop (partition -> the newest such session); one read at a
        # time, so that a ZooKeeper that does not answer holds one thread, not a queue.
        self._prefetching: dict[int, int] = {}
        self._prefetch_running = False
        self._task = asyncio.get_running_loop().create_task(self._run())

    def put(
        self, conn: StorageConnection, service: PartitionService, request: StorageMessage, size: int
    ) -> None:
        self._queue.append((conn, service, request, size))
        self._queued += 1
        self._wakeup.set()
        if request.session_id > service.info.fence_session_id:
            self._prefetch(service.partition_id, request.session_id)

    def _prefetch(self, partition_id: int, session: int) -> None:
        """Have the metadata read for a request's newer session now, on a thread of its
        own (``SessionChecks.prefetch``), while the groups queued before it run: its group
        then finds the session known instead of reading while the node waits."""
        checks = self.node.session_checks
        if checks is None or checks.known_recorded(partition_id, session):
            return
        wanted = self._prefetching
        if not wanted and not self._prefetch_running:
            asyncio.get_running_loop().call_soon(self._start_prefetch)
        if session > wanted.get(partition_id, -1):
            wanted[partition_id] = session

    def _start_prefetch(self) -> None:
        checks = self.node.session_checks
        if not self._prefetching or checks is None or self._stopping or self._prefetch_running:
            return
        wanted, self._prefetching = self._prefetching, {}
        self._prefetch_running = True
        read = asyncio.get_running_loop().run_in_executor(None, checks.prefetch, wanted)
        read.add_done_callback(self._prefetched)

    def _prefetched(self, read: asyncio.Future[None]) -> None:
        """One prefetch done: the next, for what came meanwhile."""
        self._prefetch_running = False
        if not read.cancelled() and read.exception() is not None:
            log.warning("reading sessions ahead failed: %s", read.exception())
        if self._prefetching:
            self._start_prefetch()

    async def flush(self) -> None:
        """Until every request queued so far is answered."""
        target = self._queued
        while self._answered < target and not self._task.done():
            self._progress.clear()
            await self._progress.wait()

    def _take_group(self) -> list[tuple[StorageConnection, PartitionService, StorageMessage, int]]:
        queue = self._queue
        group = [queue.popleft()]
        total = group[0][3]
        while queue and total < self._group_max_bytes:
            item = queue.popleft()
            group.append(item)
            total += item[3]
        return group

    async def _run(self) -> None:
        while True:
            if not self._queue:
                if self._stopping:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            group = self._take_group()
            responses = await self._process(group)
            # One socket write per connection for the whole group, in request order.
            answers: dict[StorageConnection, list[tuple[StorageMessage, int]]] = {}
            for (conn, _, _, size), response in zip(group, responses, strict=True):
                answers.setdefault(conn, []).append((response, size))
            for conn, items in answers.items():
                with log_context(peer=conn.peer):
                    try:
                        conn.respond(items)
                    except Exception:  # one bad response must not stop the node
                        log.exception("cannot send %d response(s) to %s", len(items), conn.peer)
            self._answered += len(group)
            self._progress.set()

    async def _process(
        self, group: list[tuple[StorageConnection, PartitionService, StorageMessage, int]]
    ) -> list[StorageMessage]:
        """The responses to ``group``, in its order."""
        requests = [(service, request) for _, service, request, _ in group]
        group_bytes = sum(size for *_, size in group)
        started = time.perf_counter()
        try:
            if runs_inline(
                requests, group_bytes, self._last_group_seconds, self._inline_max_seconds
            ):
                self.inline_groups += 1
                return self.node.process_in_order(requests)
            return await self._io.run(self.node.process_in_order, requests)
        except Exception as e:  # a bug, not an I/O error: answer, log, keep serving
            log.exception("unexpected error in a group of %d request(s)", len(group))
            return [
                FailureResponse(
                    r.session_id,
                    r.seq,
                    r.partition_id,
                    StorageError.INTERNAL,
                    f"internal error: {e}",
                )
                for _, r in requests
            ]
        finally:
            self._last_group_seconds = time.perf_counter() - started

    async def close(self) -> None:
        """Stop at once; a group already on the I/O thread still finishes there."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self._io.stop()


class StorageConnection(PeerConnection):
    peer_warnings = peer_warnings
    log_name = "connection from"
    service = Service.STORAGE
    protocol_versions = STORAGE_PROTOCOL_VERSIONS
    errors = ErrorKinds(
        refused="CONNECTION_LIMIT",
        late="TIMEOUT",
        bad_handshake="HANDSHAKE",
        malformed=StorageError.MALFORMED_REQUEST.name,
        unauthorized="UNAUTHORIZED",
    )

    def __init__(self, server: StorageServer) -> None:
        settings = server.settings
        super().__init__(
            server.guard,
            lambda kind: server.node.metrics.errors.labels(kind).inc(),
            settings.write_buffer_max_bytes,
            settings.unopened_max_frame_bytes,  # until Open has checked the cluster key
        )
        self._server = server
        self._settings = settings
        self._queued_requests = 0
        self._queued_bytes = 0
        self._paused = False  # too much queued
        self._node_paused = False  # too much queued on the whole node
        self._write_blocked = False  # the peer is not reading its responses
        self._over_budget = False  # partial frames of all connections over the budget
        # Once the hello settled the version (``_settle_version``): how its frames decode,
        # and whether it is older than commit times (its records converted both ways).
        self._limits: Limits | None = None
        self._older = False

    # --- asyncio.Protocol ---------------------------------------------------------------

    def accepted(self, transport: asyncio.BaseTransport) -> bool:
        if not super().accepted(transport):
            return False
        self._server.node.metrics.connections.inc()
        return True

    def _identity_refusal(self) -> str | None:
        """With mutual TLS, only the identities of tls_allowed_peers (the servers)."""
        tls, allowed = self._settings.tls, self._settings.allowed_peers
        if tls is None or not tls.files.verify_peer or identity_allowed(self.identity, allowed):
            return None
        return (
            f"certificate identity {self.identity!r} is not one of tls_allowed_peers "
            f"({','.join(allowed)})"
        )

    def data_received(self, data: bytes) -> None:
        # Each protocol callback sets the peer's address for what it logs (the hot path:
        # no log_context object).
        token = PEER.set(self.peer)
        try:
            super().data_received(data)
        finally:
            PEER.reset(token)

    def connection_lost(self, exc: Exception | None) -> None:
        with log_context(peer=self.peer):
            super().connection_lost(exc)
            self._server.waiting.pop(self, None)

    def pause_writing(self) -> None:
        self._write_blocked = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_blocked = False
        with log_context(peer=self.peer):
            self._work_through_backlog()

    def over_budget(self, over: bool) -> None:
        self._over_budget = over
        self._update_reading()

    def _holds_reading(self) -> bool:
        return self._paused or self._node_paused or self._write_blocked or self._over_budget

    def _holds_frames(self) -> bool:
        """Too much queued, or replies unread (partial frames over the budget only stop
        the socket being read)."""
        return self._paused or self._node_paused or self._write_blocked

    # --- dispatch, responses ------------------------------------------------------------

    def _take(self, message_type: int, body: bytes) -> None:
        limits = self._limits or self._settle_version()
        request = decode_request(message_type, body, limits)
        if self._older:
            request = in_record_format(request, DEFAULT_FORMAT)
        self._dispatch(request, len(body) + 5)

    def _settle_version(self) -> Limits:
        """The limits frames of the version the hello settled on decode with (before the
        first frame is taken: ``self.version`` is set by then)."""
        fmt = record_format(self.version)
        self._older = self.version < COMMIT_TIME_VERSION
        self._limits = replace(self._settings.limits, record_format=fmt)
        return self._limits

    def _dispatch(self, request: StorageMessage, size: int) -> None:
        self._server.count_request(type(request))
        if isinstance(request, OpenRequest):
            response = self._server.node.check_open(request)
            failed = isinstance(response, FailureResponse)
            if not self._ready and not failed:
                self._become_ready()
                assert self._decoder is not None
                self._decoder.max_frame_bytes = self._settings.max_frame_bytes
            self._send(response)
            if failed and self._ready:
                # Opened once, then an Open that fails: not the peer it was; say why, close.
                self._warn("closing", f"a second Open failed ({response.error.name})")
                self.close()
            return
        if not self._ready:
            self._send_failure(
                request,
                StorageError.NOT_OPEN,
                "send an Open request (cluster key) before partition requests",
            )
            return
        service = self._server.serving.get(request.partition_id)
        if service is None:
            self._send_failure(
                request,
                StorageError.PARTITION_NOT_FOUND,
                f"partition {request.partition_id} is not held by this storage "
                f"node (it holds {self._server.partition_list()})",
            )
            return
        if isinstance(request, _READS):
            # Its response may be this large: count it now, so that reads whose replies
            # are never collected cannot queue more than queue_max_bytes of them.
            size = max(size, self._server.node.settings.max_response_bytes)
        self._queued_requests += 1
        self._queued_bytes += size
        if self._server.queue_grew(size) and not self._node_paused:
            self._node_paused = True
            self._server.waiting[self] = None
            self._update_reading()
        if not self._paused and (
            self._queued_requests >= self._settings.queue_max_requests
            or self._queued_bytes >= self._settings.queue_max_bytes
        ):
            self._paused = True
            self._update_reading()
        self._server.worker.put(self, service, request, size)

    def respond(self, answers: list[tuple[StorageMessage, int]]) -> None:
        """A worker's answers to some of this connection's queued requests (each with the
        size it was queued with), in order: one socket write for all of them."""
        size = sum(queued for _, queued in answers)
        self._queued_requests -= len(answers)
        self._queued_bytes -= size
        self._server.queue_shrank(size)
        if self._transport is None:
            return
        if not self._transport.is_closing():
            if self._older:  # a peer before commit times: its records in format 1
                answers = [(in_record_format(r, FORMAT_1), queued) for r, queued in answers]
            # Records read from disk go to the socket as they are, not copied into a frame.
            write_buffers(
                self._transport,
                [part for response, _ in answers for part in response.encode_parts()],
            )
        if self._paused and (
            self._queued_requests <= self._settings.queue_max_requests // 2
            and self._queued_bytes <= self._settings.queue_max_bytes // 2
        ):
            self._paused = False
            self._work_through_backlog()

    def node_resumed(self) -> None:
        """The node's queues fell below half their budget: take requests again."""
        self._node_paused = False
        with log_context(peer=self.peer):
            self._work_through_backlog()

    def _send(self, response: StorageMessage) -> None:
        if self._transport is not None and not self._transport.is_closing():
            if self._older:
                response = in_record_format(response, FORMAT_1)
            self._transport.write(response.encode())

    def _send_failure(self, request: StorageMessage, error: StorageError, message: str) -> None:
        self._on_error(error.name)
        self._send(
            FailureResponse(request.session_id, request.seq, request.partition_id, error, message)
        )

    def _tell_malformed(self, reason: str) -> None:
        self._send(FailureResponse(-1, -1, -1, StorageError.MALFORMED_REQUEST, reason))


class StorageServer:
    def __init__(self, node: StorageNode, settings: ServerSettings | None = None) -> None:
        self.node = node
        self.settings = settings or ServerSettings()
        self.serving: dict[int, PartitionService] = {}  # the partitions it takes requests for
        self._worker: NodeWorker | None = None
        self._request_counters: dict[type, Any] = {}
        self._server: asyncio.Server | None = None
        self.guard = PeerGuard(self.settings.peer, "successful Open", self.settings.max_frame_bytes)
        # Bytes queued on all connections (reads counted as their largest reply), and the
        # connections that stopped reading because of it.
        self.queued_bytes = 0
        self.waiting: dict[StorageConnection, None] = {}
        # Read at scrape time: nothing on the request path but the additions.
        node.metrics.queued_bytes.set_function(lambda: self.queued_bytes)

    def queue_grew(self, size: int) -> bool:
        """Count ``size`` more queued bytes; True when the node is at its budget."""
        self.queued_bytes += size
        return self.queued_bytes >= self.settings.node_queue_max_bytes

    def queue_shrank(self, size: int) -> None:
        self.queued_bytes -= size
        if self.waiting and self.queued_bytes <= self.settings.node_queue_max_bytes // 2:
            waiting, self.waiting = self.waiting, {}
            for conn in waiting:
                conn.node_resumed()

    @property
    def connections(self) -> set[StorageConnection]:
        return self.guard.connections  # type: ignore[return-value]

    def count_request(self, kind: type) -> None:
        """waltz_storage_requests_total for this request type (its series looked up once)."""
        counter = self._request_counters.get(kind)
        if counter is None:
            counter = self._request_counters[kind] = self.node.metrics.requests.labels(
                kind.__name__
            )
        counter.inc()

    def partition_list(self) -> str:
        return ",".join(str(p) for p in sorted(self.serving)) or "none"

    @property
    def worker(self) -> NodeWorker:
        assert self._worker is not None, "start() first"
        return self._worker

    @property
    def listening(self) -> bool:
        return self._server is not None and self._server.is_serving()

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the bound port (useful with port 0)."""
        self._worker = NodeWorker(
            self.node,
            self.settings.write_group_max_bytes,
            self.settings.inline_group_max_seconds,
        )
        self.serving = dict(self.node.partitions)
        tls = self.settings.tls
        self._server = await listen(
            lambda: StorageConnection(self),
            host,
            port,
            ssl_context=tls.listening_context() if tls is not None else None,
            handshake_timeout=self.settings.peer.handshake_timeout,
        )
        self.guard.start()
        return self._server.sockets[0].getsockname()[1]

    def add_partition(self, partition_id: int) -> None:
        """Serve a partition the node has just opened."""
        self.serving[partition_id] = self.node.partitions[partition_id]

    async def remove_partition(self, partition_id: int) -> None:
        """Stop serving a partition: new requests get PARTITION_NOT_FOUND, queued ones finish."""
        if self.serving.pop(partition_id, None) is not None and self._worker is not None:
            await self._worker.flush()

    async def close(self) -> None:
        await self.guard.stop()
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.hang_up()
        if self._worker is not None:
            await self._worker.close()
        if self._server is not None:
            await self._server.wait_closed()
