"""An asyncio client for one storage node: handshake, pipelined requests, responses by seq.

Used by the server's replica sessions, by the admin tools and by the storage
benchmark. Requests may be pipelined: ``submit`` writes at once and returns
a future; responses are matched to requests by sequence number.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import struct
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import cast

from .corked import CorkedWriter, write_buffers
from .errors import HandshakeError, ProtocolError
from .frame_protocol import FrameProtocol
from .framing import (
    DEFAULT_MAX_FRAME_BYTES,
    HANDSHAKE_BYTES,
    HandshakeStatus,
    Hello,
    HelloReply,
    OpenConnection,
    Service,
)
from .records import DEFAULT_FORMAT, Record, RecordBatch, RecordHeader, UncheckedRecords
from .storage_messages import (
    COMMIT_TIME_VERSION,
    DEFAULT_LIMITS,
    RETENTION_VERSION,
    STORAGE_PROTOCOL_VERSIONS,
    AppendRequest,
    FailureResponse,
    FindTimeRequest,
    FindTimeResponse,
    LastSessionInfoRequest,
    LastSessionInfoResponse,
    Limits,
    LogInfoRequest,
    LogInfoResponse,
    MaxTransactionIdRequest,
    MaxTransactionIdResponse,
    OpenRequest,
    RecordHeaderListRequest,
    RecordHeaderListResponse,
    RecordHeaderRequest,
    RecordHeaderResponse,
    RecordListRequest,
    RecordListResponse,
    RecordRequest,
    RecordResponse,
    SetLogStartRequest,
    SetLowWaterMarkRequest,
    StorageError,
    StorageMessage,
    StorageMessageType,
    TruncateRequest,
    decode_response,
    decode_unchecked_record_list,
    in_record_format,
    record_format,
)

log = logging.getLogger(__name__)

_SEQ = struct.Struct(">q")  # a response's sequence number, after its session ID
_SEQ_END = 16


class StorageFailure(Exception):
    """The storage node answered a request with a Failure response."""

    def __init__(self, error: StorageError, message: str) -> None:
        super().__init__(f"{error.name}: {message}")
        self.error = error
        self.message = message


class StorageConnectionClosed(ConnectionError):
    """The connection closed before a response arrived."""


# ``on_answer(response, None)`` when a request's response is read, or
# ``on_answer(None, error)`` when the connection closes first (``send_parts``).
OnAnswer = Callable[[StorageMessage | None, BaseException | None], None]


class StorageClient:
    def __init__(
        self,
        writer: asyncio.StreamWriter,
        version: int,
        max_frame_bytes: int,
        limits: Limits,
        corked: bool = False,
    ) -> None:
        self._writer = writer
        # Corked: the requests of one loop turn leave in one system call (a connection
        # shared by a server's partitions, storage_pool.py).
        self._cork = CorkedWriter(writer.transport) if corked else None
        self.version = version
        # A node of an older version sends and takes records in format 1: they are
        # converted here, so every caller sees format 2 (``in_record_format``).
        self._older = version < COMMIT_TIME_VERSION
        self._limits = replace(limits, record_format=record_format(version))
        # Who waits for each request's response: a future (``submit``) or a call
        # (``send_parts``).
        self._pending: dict[int, asyncio.Future[StorageMessage] | OnAnswer] = {}
        self._unchecked: set[int] = set()  # requests whose records the caller relays unread
        self._seqs = itertools.count(1)
        self._closed: BaseException | None = None
        # The handshake is done and the node sends nothing unasked: from here the socket
        # reads go straight into frame buffers.
        # (typeshed types a stream's transport as a WriteTransport; it reads too.)
        self._protocol = FrameProtocol(
            cast(asyncio.Transport, writer.transport),
            self._on_frame,
            self._on_closed,
            max_frame_bytes,
        )

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        *,
        timeout: float = 10.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        limits: Limits = DEFAULT_LIMITS,
        open_connection: OpenConnection = asyncio.open_connection,
        corked: bool = False,
        versions: range = STORAGE_PROTOCOL_VERSIONS,
    ) -> StorageClient:
        """``open_connection``: how to reach ``host:port`` (a simulated network in tests);
        ``corked``: requests written in one turn of the loop leave in one system call;
        ``versions``: the protocol versions offered (fewer: to act as an older server)."""

        async def dial() -> StorageClient:
            reader, writer = await open_connection(host, port)
            try:
                hello = Hello(Service.STORAGE, versions.start, versions.stop - 1)
                writer.write(hello.encode())
                reply = HelloReply.decode(await reader.readexactly(HANDSHAKE_BYTES))
            except BaseException:
                writer.close()
                raise
            if reply.status != HandshakeStatus.OK:
                writer.close()
                raise HandshakeError(
                    f"storage {host}:{port} refused the handshake: {reply.status.name}"
                )
            if reply.version not in versions:
                writer.close()
                raise HandshakeError(
                    f"storage {host}:{port} chose protocol version "
                    f"{reply.version}, which this client does not speak"
                )
            return cls(writer, reply.version, max_frame_bytes, limits, corked)

        async with asyncio.timeout(timeout):
            return await dial()

    @property
    def closed(self) -> bool:
        return self._closed is not None

    def next_seq(self) -> int:
        return next(self._seqs)

    def _on_frame(self, message_type: int, body: bytes | bytearray) -> None:
        if (
            self._unchecked
            and message_type == StorageMessageType.RECORD_LIST_RESPONSE
            and len(body) >= _SEQ_END
            and _SEQ.unpack_from(body, 8)[0] in self._unchecked
        ):
            message = decode_unchecked_record_list(body, self._limits)
            self._unchecked.discard(message.seq)
        else:
            message = decode_response(message_type, body, self._limits)
            if self._older:
                message = in_record_format(message, DEFAULT_FORMAT)
        waiter = self._pending.pop(message.seq, None)
        if waiter is None:
            raise ProtocolError(f"response for unknown sequence number {message.seq}")
        if isinstance(waiter, asyncio.Future):
            if not waiter.done():
                waiter.set_result(message)
        else:
            waiter(message, None)  # if it raises, the connection ends (FrameProtocol)

    def _on_closed(self, error: BaseException | None) -> None:
        if error is not None:
            log.warning("storage connection failed: %s", error)
        self._fail_all(error or StorageConnectionClosed("storage connection closed"))

    def _fail_all(self, error: BaseException) -> None:
        self._closed = error
        pending, self._pending = self._pending, {}
        for waiter in pending.values():
            if not isinstance(waiter, asyncio.Future):
                try:
                    waiter(None, StorageConnectionClosed(str(error)))
                except Exception:  # a bug in one must not keep the others from hearing
                    log.exception("a storage request's on_answer failed")
            elif not waiter.done():
                waiter.set_exception(StorageConnectionClosed(str(error)))

    def submit(self, request: StorageMessage) -> asyncio.Future[StorageMessage]:
        """Send ``request`` now; the future resolves with its response (Failure included)."""
        if self._older:
            request = in_record_format(request, self._limits.record_format)
        return self.submit_frame(request.seq, request.encode())

    def submit_frame(self, seq: int, frame: bytes) -> asyncio.Future[StorageMessage]:
        """Send a frame encoded by the caller (benchmarks reuse buffers); ``seq`` must be in it.
        Raises StorageConnectionClosed (a ConnectionError) if the connection is gone."""
        return self.submit_parts(seq, [frame])

    def submit_parts(
        self, seq: int, parts: Sequence[bytes | bytearray | memoryview]
    ) -> asyncio.Future[StorageMessage]:
        """``submit_frame`` for a frame given as buffers written in turn (``frame_parts``)."""
        self._write(parts)
        future: asyncio.Future[StorageMessage] = asyncio.get_running_loop().create_future()
        # A request whose caller gave up (a timeout, a session that ended) still fails when
        # the connection closes: retrieve that, or asyncio logs it as never retrieved.
        future.add_done_callback(_retrieve)
        self._pending[seq] = future
        return future

    def send_parts(
        self, seq: int, parts: Sequence[bytes | bytearray | memoryview], on_answer: OnAnswer
    ) -> None:
        """``submit_parts`` answered through ``on_answer`` (see ``OnAnswer``), called as
        the response's frame is read: no future and no turn of the loop between the two.
        A store session sends each batch this way to every member, so the batch commits
        in the turn that reads its quorum's answers. Raises StorageConnectionClosed if the
        connection is gone."""
        self._write(parts)
        self._pending[seq] = on_answer

    def _write(self, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        if self._closed is not None or self._writer.is_closing():
            raise StorageConnectionClosed(f"storage connection is closed: {self._closed}")
        try:
            if self._cork is not None:
                self._cork.writelines(parts)
            else:
                write_buffers(self._writer.transport, list(parts))
        except RuntimeError as e:  # uvloop: "unable to perform operation on <... closed=True>"
            raise StorageConnectionClosed(f"storage connection is closed: {e}") from e

    async def call(self, request: StorageMessage) -> StorageMessage:
        """Send and await the response; a Failure response raises StorageFailure."""
        future = self.submit(request)
        await self._protocol.drain()
        response = await future
        if isinstance(response, FailureResponse):
            raise StorageFailure(response.error, response.message)
        return response

    def close_soon(self) -> None:
        """Start closing now (from a callback that cannot await): every pending request
        fails with StorageConnectionClosed once the transport is gone."""
        self._writer.close()

    async def close(self) -> None:
        if self._cork is not None and not self._writer.is_closing():
            self._cork.flush()  # what was written still goes, as without the cork
        self._writer.close()
        with contextlib.suppress(OSError):
            # One wait shared by every close() of this client; a cancelled caller must
            # not cancel it for the others (a partition stopping while its session loop
            # closes the same session got CancelledError).
            await self._protocol.wait_closed_or_abort()

    async def __aenter__(self) -> StorageClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- one method per request type ----------------------------------------------------

    async def open(self, cluster_key: uuid.UUID, num_partitions: int) -> None:
        await self.call(OpenRequest(-1, self.next_seq(), -1, cluster_key, num_partitions))

    async def last_session_info(
        self, session_id: int, partition_id: int
    ) -> LastSessionInfoResponse:
        r = await self.call(LastSessionInfoRequest(session_id, self.next_seq(), partition_id))
        assert isinstance(r, LastSessionInfoResponse)
        return r

    async def max_transaction_id(self, session_id: int, partition_id: int) -> int:
        r = await self.call(MaxTransactionIdRequest(session_id, self.next_seq(), partition_id))
        assert isinstance(r, MaxTransactionIdResponse)
        return r.transaction_id

    async def truncate(self, session_id: int, partition_id: int, transaction_id: int) -> None:
        await self.call(TruncateRequest(session_id, self.next_seq(), partition_id, transaction_id))

    async def set_low_water_mark(self, session_id: int, partition_id: int, mark: int) -> None:
        await self.call(SetLowWaterMarkRequest(session_id, self.next_seq(), partition_id, mark))

    @property
    def speaks_commit_time(self) -> bool:
        """Whether the node stores commit times (protocol version 3: records of format 2);
        a node of an older version takes and returns records without them."""
        return not self._older

    @property
    def speaks_retention(self) -> bool:
        """Whether the node knows Log Info and Set Log Start (protocol version 2)."""
        return self.version >= RETENTION_VERSION

    async def log_info(self, session_id: int, partition_id: int) -> LogInfoResponse:
        r = await self.call(LogInfoRequest(session_id, self.next_seq(), partition_id))
        assert isinstance(r, LogInfoResponse)
        return r

    async def find_time(self, session_id: int, partition_id: int, time_ms: int) -> int:
        """The first transaction the node stores committed at or after ``time_ms`` (its
        last + 1 if none): protocol version 3."""
        if self._older:
            raise StorageFailure(
                StorageError.MALFORMED_REQUEST,
                f"this storage node speaks protocol {self.version}, which has no Find Time",
            )
        r = await self.call(FindTimeRequest(session_id, self.next_seq(), partition_id, time_ms))
        assert isinstance(r, FindTimeResponse)
        return r.transaction_id

    async def set_log_start(self, session_id: int, partition_id: int, log_start: int) -> None:
        await self.call(SetLogStartRequest(session_id, self.next_seq(), partition_id, log_start))

    def append_request(
        self, session_id: int, partition_id: int, records: RecordBatch | list[Record]
    ) -> AppendRequest:
        batch = records if isinstance(records, RecordBatch) else RecordBatch.from_records(records)
        return AppendRequest(session_id, self.next_seq(), partition_id, batch)

    async def append(
        self, session_id: int, partition_id: int, records: RecordBatch | list[Record]
    ) -> None:
        await self.call(self.append_request(session_id, partition_id, records))

    async def record_header(self, session_id: int, partition_id: int, txid: int) -> RecordHeader:
        r = await self.call(RecordHeaderRequest(session_id, self.next_seq(), partition_id, txid))
        assert isinstance(r, RecordHeaderResponse) and r.record_header is not None
        return r.record_header

    async def record(self, session_id: int, partition_id: int, txid: int) -> Record:
        r = await self.call(RecordRequest(session_id, self.next_seq(), partition_id, txid))
        assert isinstance(r, RecordResponse) and r.record is not None
        return r.record

    async def record_headers(
        self, session_id: int, partition_id: int, txid: int, max_records: int
    ) -> list[RecordHeader]:
        r = await self.call(
            RecordHeaderListRequest(session_id, self.next_seq(), partition_id, txid, max_records)
        )
        assert isinstance(r, RecordHeaderListResponse)
        return list(r.headers)

    async def records(
        self, session_id: int, partition_id: int, txid: int, max_records: int
    ) -> RecordBatch:
        r = await self.call(
            RecordListRequest(session_id, self.next_seq(), partition_id, txid, max_records)
        )
        assert isinstance(r, RecordListResponse)
        return r.records

    async def records_unchecked(
        self, session_id: int, partition_id: int, txid: int, max_records: int
    ) -> UncheckedRecords:
        """``records``, counted but not walked or checked: for a server relaying them to a
        range-read client, which checks each record itself (a Failure still raises)."""
        request = RecordListRequest(session_id, self.next_seq(), partition_id, txid, max_records)
        self._unchecked.add(request.seq)
        try:
            r = await self.call(request)
        finally:
            self._unchecked.discard(request.seq)
        assert isinstance(r, RecordListResponse) and isinstance(r.records, UncheckedRecords)
        return r.records


def _retrieve(future: asyncio.Future[StorageMessage]) -> None:
    if not future.cancelled():
        future.exception()


async def answers_handshake(
    address: str, timeout: float, open_connection: OpenConnection = asyncio.open_connection
) -> bool:
    """Whether the storage node at ``host:port`` answers the handshake within ``timeout``
    (a probe: refused, timed out, closed midway or another service all count as no)."""
    host, _, port = address.rpartition(":")
    try:
        client = await StorageClient.connect(
            host, int(port), timeout=timeout, open_connection=open_connection
        )
    except Exception:
        return False
    await client.close()
    return True
