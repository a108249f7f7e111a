"""The storage node's asyncio TCP server: connections, per-partition workers, back pressure.

Each connection decodes frames as they arrive and queues each partition
request on that partition's worker. A worker drains its queue, hands the
batch to ``PartitionService.process`` on a thread (file I/O and fsync never
block the event loop) and writes the responses back in order. A connection
stops reading its socket while it has too many requests (or bytes) queued.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from waltz_client.wire.errors import ProtocolError
from waltz_client.wire.framing import (
    DEFAULT_MAX_FRAME_BYTES,
    HANDSHAKE_BYTES,
    FrameDecoder,
    HandshakeStatus,
    Hello,
    Service,
    negotiate,
)
from waltz_client.wire.storage_messages import (
    DEFAULT_LIMITS,
    STORAGE_PROTOCOL_VERSIONS,
    FailureResponse,
    Limits,
    OpenRequest,
    StorageError,
    StorageMessage,
    decode_request,
)

from .service import PartitionService, StorageNode

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ServerSettings:
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    limits: Limits = DEFAULT_LIMITS
    queue_max_requests: int = 1024  # per connection, before it stops reading
    queue_max_bytes: int = 64 * 1024 * 1024
    write_group_max_bytes: int = 8 * 1024 * 1024  # requests one worker hands over at once


class PartitionWorker:
    """Runs one partition's requests in arrival order, a drained batch at a time."""

    def __init__(
        self, service: PartitionService, executor: ThreadPoolExecutor, group_max_bytes: int
    ) -> None:
        self.service = service
        self._executor = executor
        self._group_max_bytes = group_max_bytes
        self._queue: collections.deque[tuple[StorageConnection, StorageMessage, int]] = (
            collections.deque()
        )
        self._wakeup = asyncio.Event()
        self._stopping = False
        self._task = asyncio.get_running_loop().create_task(self._run())

    def put(self, conn: StorageConnection, request: StorageMessage, size: int) -> None:
        self._queue.append((conn, request, size))
        self._wakeup.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        queue = self._queue
        while True:
            if not queue:
                if self._stopping:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            batch = [queue.popleft()]
            total = batch[0][2]
            while queue and total < self._group_max_bytes:
                item = queue.popleft()
                batch.append(item)
                total += item[2]
            requests = [request for _, request, _ in batch]
            try:
                responses = await loop.run_in_executor(
                    self._executor, self.service.process, requests
                )
            except Exception as e:  # a bug, not an I/O error: answer, log, keep serving
                log.exception("partition %d: unexpected error", self.service.partition_id)
                responses = [
                    FailureResponse(
                        r.session_id,
                        r.seq,
                        r.partition_id,
                        StorageError.INTERNAL,
                        f"internal error: {e}",
                    )
                    for r in requests
                ]
            for (conn, _, size), response in zip(batch, responses, strict=True):
                try:
                    conn.respond(response, size)
                except Exception:  # one bad response must not stop the partition
                    log.exception(
                        "partition %d: cannot send %s to %s",
                        self.service.partition_id,
                        type(response).__name__,
                        conn.peer,
                    )

    async def drain_and_stop(self) -> None:
        """Answer what is queued (and the batch on its thread), then stop."""
        self._stopping = True
        self._wakeup.set()
        await self._task

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


class StorageConnection(asyncio.Protocol):
    def __init__(self, server: StorageServer) -> None:
        self._server = server
        self._settings = server.settings
        self._transport: asyncio.Transport | None = None
        self._hello = bytearray()
        self._decoder: FrameDecoder | None = None
        self._opened = False
        self._queued_requests = 0
        self._queued_bytes = 0
        self._paused = False
        self.peer = "?"

    # --- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self._server.connections.add(self)
        self._server.node.metrics.connections.inc()

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        self._transport = None

    def eof_received(self) -> bool:
        """The peer finished sending: a partial frame left in the buffer is a malformed one."""
        if self._decoder is not None and self._decoder.buffered:
            self._reject(
                f"MalformedFrame: truncated frame: the stream ended inside it "
                f"after {self._decoder.buffered} bytes"
            )
        return False  # close our side too

    def data_received(self, data: bytes) -> None:
        if self._decoder is None:
            self._handshake(data)
            return
        try:
            frames = self._decoder.feed(data)
            for message_type, body in frames:
                request = decode_request(message_type, body, self._settings.limits)
                self._dispatch(request, len(body) + 5)
        except ProtocolError as e:
            self._reject(f"{type(e).__name__}: {e}")

    # --- handshake, dispatch, responses -------------------------------------------------

    def _handshake(self, data: bytes) -> None:
        self._hello += data
        if len(self._hello) < HANDSHAKE_BYTES:
            return
        try:
            hello = Hello.decode(bytes(self._hello[:HANDSHAKE_BYTES]))
        except ProtocolError as e:
            self._server.node.metrics.errors.labels("HANDSHAKE").inc()
            log.warning("closing connection from %s: %s", self.peer, e)
            assert self._transport is not None
            self._transport.close()
            return
        reply = negotiate(hello, Service.STORAGE, STORAGE_PROTOCOL_VERSIONS)
        assert self._transport is not None
        self._transport.write(reply.encode())
        if reply.status != HandshakeStatus.OK:
            self._server.node.metrics.errors.labels("HANDSHAKE").inc()
            log.warning(
                "closing connection from %s: handshake %s (client speaks %s %d..%d)",
                self.peer,
                reply.status.name,
                hello.service.name,
                hello.min_version,
                hello.max_version,
            )
            self._transport.close()
            return
        self._decoder = FrameDecoder(self._settings.max_frame_bytes)
        rest = bytes(self._hello[HANDSHAKE_BYTES:])
        self._hello = bytearray()
        if rest:
            self.data_received(rest)

    def _dispatch(self, request: StorageMessage, size: int) -> None:
        metrics = self._server.node.metrics
        metrics.requests.labels(type(request).__name__).inc()
        if isinstance(request, OpenRequest):
            response = self._server.node.check_open(request)
            self._opened = self._opened or not isinstance(response, FailureResponse)
            self._send(response)
            return
        if not self._opened:
            self._send_failure(
                request,
                StorageError.NOT_OPEN,
                "send an Open request (cluster key) before partition requests",
            )
            return
        worker = self._server.workers.get(request.partition_id)
        if worker is None:
            self._send_failure(
                request,
                StorageError.PARTITION_NOT_FOUND,
                f"partition {request.partition_id} is not held by this storage "
                f"node (it holds {self._server.partition_list()})",
            )
            return
        self._queued_requests += 1
        self._queued_bytes += size
        if not self._paused and (
            self._queued_requests >= self._settings.queue_max_requests
            or self._queued_bytes >= self._settings.queue_max_bytes
        ):
            self._paused = True
            assert self._transport is not None
            self._transport.pause_reading()
        worker.put(self, request, size)

    def respond(self, response: StorageMessage, size: int) -> None:
        """A worker's answer to one of this connection's queued requests."""
        self._queued_requests -= 1
        self._queued_bytes -= size
        if self._transport is None:
            return
        self._send(response)
        if self._paused and (
            self._queued_requests <= self._settings.queue_max_requests // 2
            and self._queued_bytes <= self._settings.queue_max_bytes // 2
        ):
            self._paused = False
            self._transport.resume_reading()

    def _send(self, response: StorageMessage) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(response.encode())

    def _send_failure(self, request: StorageMessage, error: StorageError, message: str) -> None:
        self._server.node.metrics.errors.labels(error.name).inc()
        self._send(
            FailureResponse(request.session_id, request.seq, request.partition_id, error, message)
        )

    def _reject(self, reason: str) -> None:
        """A malformed frame: say why, then close this connection only."""
        self._server.node.metrics.errors.labels(StorageError.MALFORMED_REQUEST.name).inc()
        log.warning("closing connection from %s: %s", self.peer, reason)
        self._send(FailureResponse(-1, -1, -1, StorageError.MALFORMED_REQUEST, reason))
        if self._transport is not None:
            self._transport.close()
        self._decoder = FrameDecoder(self._settings.max_frame_bytes)  # drop buffered input


class StorageServer:
    def __init__(self, node: StorageNode, settings: ServerSettings | None = None) -> None:
        self.node = node
        self.settings = settings or ServerSettings()
        self.connections: set[StorageConnection] = set()
        self.workers: dict[int, PartitionWorker] = {}
        self._executor = ThreadPoolExecutor(
            # Partitions may arrive later (from ZooKeeper): size for a few per core.
            max_workers=min(32, max(8, len(node.partitions))),
            thread_name_prefix="waltz-storage-io",
        )
        self._server: asyncio.Server | None = None

    def partition_list(self) -> str:
        return ",".join(str(p) for p in sorted(self.workers)) or "none"

    @property
    def listening(self) -> bool:
        return self._server is not None and self._server.is_serving()

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the bound port (useful with port 0)."""
        for p, service in self.node.partitions.items():
            self.workers[p] = PartitionWorker(
                service, self._executor, self.settings.write_group_max_bytes
            )
        self._server = await asyncio.get_running_loop().create_server(
            lambda: StorageConnection(self), host, port, reuse_address=True
        )
        return self._server.sockets[0].getsockname()[1]

    def add_partition(self, partition_id: int) -> None:
        """Serve a partition the node has just opened."""
        if partition_id not in self.workers:
            self.workers[partition_id] = PartitionWorker(
                self.node.partitions[partition_id],
                self._executor,
                self.settings.write_group_max_bytes,
            )

    async def remove_partition(self, partition_id: int) -> None:
        """Stop serving a partition: new requests get PARTITION_NOT_FOUND, queued ones finish."""
        worker = self.workers.pop(partition_id, None)
        if worker is not None:
            await worker.drain_and_stop()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            if conn._transport is not None:
                conn._transport.close()
        for worker in self.workers.values():
            await worker.close()
        self._executor.shutdown(wait=True)
        if self._server is not None:
            await self._server.wait_closed()
