"""One connection to a server: handshake, pipelined sends, every message from the server.

The building block of the client library (which keeps a stream and an RPC
connection per server) and of tools and tests. ``send`` writes at once;
messages the server sends arrive, in order, at the ``on_message`` callback
(or in ``messages``, a queue, when no callback is given).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import cast

from .client_messages import (
    PROTOCOL_VERSION,
    SERVER_PROTOCOL_VERSIONS,
    ClientMessage,
    decode_server_response,
)
from .errors import HandshakeError
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
from .records import DEFAULT_MAX_DATA_BYTES

log = logging.getLogger(__name__)


class ServerConnectionClosed(ConnectionError):
    pass


class ServerConnection:
    def __init__(
        self,
        writer: asyncio.StreamWriter,
        endpoint: str,
        on_message: Callable[[ClientMessage], None] | None,
        max_frame_bytes: int,
        max_data_bytes: int,
        check_records: bool = True,
        feed_rows: bool = False,
        version: int = PROTOCOL_VERSION,
    ) -> None:
        self._writer = writer
        self.endpoint = endpoint
        self.messages: asyncio.Queue[ClientMessage] = asyncio.Queue()
        self._on_message = on_message or self.messages.put_nowait
        self._max_data_bytes = max_data_bytes
        self._check_records = check_records
        self._feed_rows = feed_rows
        self.closed_reason: str | None = None
        self.closed_event = asyncio.Event()
        # As the handshake settled it: how the server lays out feed rows and records.
        self.protocol_version = version
        self._out: list[bytes] = []
        # The handshake is done and the server sends nothing unasked: from here the
        # socket reads go straight into frame buffers.
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
        on_message: Callable[[ClientMessage], None] | None = None,
        timeout: float = 10.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_data_bytes: int = DEFAULT_MAX_DATA_BYTES,
        open_connection: OpenConnection = asyncio.open_connection,
        check_records: bool = True,
        feed_rows: bool = False,
        max_version: int | None = None,
    ) -> ServerConnection:
        """``check_records=False``: range reads' records arrive unchecked (the caller
        checks them: ``decode_server_response``). ``feed_rows``: feeds arrive as
        ``FeedRows``. ``max_version``: the newest protocol version offered (None: the
        newest this build speaks; a lower one acts as an older client, for tests)."""
        endpoint = f"{host}:{port}"
        lo, hi = SERVER_PROTOCOL_VERSIONS.start, SERVER_PROTOCOL_VERSIONS.stop - 1
        if max_version is not None:
            if max_version not in SERVER_PROTOCOL_VERSIONS:
                raise ValueError(
                    f"max_version {max_version!r}: this build speaks protocol versions {lo}..{hi}"
                )
            hi = max_version

        async def dial() -> ServerConnection:
            reader, writer = await open_connection(host, port)
            try:
                writer.write(Hello(Service.SERVER, lo, hi).encode())
                reply = HelloReply.decode(await reader.readexactly(HANDSHAKE_BYTES))
                if reply.status != HandshakeStatus.OK:
                    raise HandshakeError(f"server {endpoint} refused: {reply.status.name}")
                if not lo <= reply.version <= hi:
                    raise HandshakeError(
                        f"server {endpoint} chose protocol version {reply.version}, "
                        f"outside the {lo}..{hi} offered"
                    )
            except BaseException:
                writer.close()
                raise
            return cls(
                writer,
                endpoint,
                on_message,
                max_frame_bytes,
                max_data_bytes,
                check_records,
                feed_rows,
                reply.version,
            )

        async with asyncio.timeout(timeout):
            return await dial()

    @property
    def closed(self) -> bool:
        return self.closed_reason is not None

    def send(self, message: ClientMessage) -> None:
        self.send_frame(message.encode())

    def send_frame(self, frame: bytes) -> None:
        """Queue a frame; everything sent in one turn of the event loop goes out in one
        write (many small appends, one system call)."""
        if self.closed_reason is not None:
            raise ServerConnectionClosed(f"{self.endpoint}: {self.closed_reason}")
        self._out.append(frame)
        if len(self._out) == 1:
            asyncio.get_running_loop().call_soon(self._flush_out)

    def _flush_out(self) -> None:
        out, self._out = self._out, []
        if out and self.closed_reason is None:
            self._writer.write(b"".join(out))

    def pause_reading(self) -> None:
        """Stop reading the socket (the consumer is behind): the server's writes back up,
        and its feeds wait for us. It takes effect between two messages."""
        self._protocol.pause()

    def resume_reading(self) -> None:
        self._protocol.resume()

    async def drain(self) -> None:
        self._flush_out()
        await self._protocol.drain()

    def _on_frame(self, message_type: int, body: bytes | bytearray) -> None:
        self._on_message(
            decode_server_response(
                message_type,
                body,
                self._max_data_bytes,
                check_records=self._check_records,
                feed_rows=self._feed_rows,
                version=self.protocol_version,
            )
        )

    def _on_closed(self, error: BaseException | None) -> None:
        if error is not None:
            reason = f"{type(error).__name__}: {error}"
            log.warning("connection to %s failed: %s", self.endpoint, reason)
        else:
            reason = "closed by the server"
        if self.closed_reason is None:
            self.closed_reason = reason
        self.closed_event.set()

    async def close(self) -> None:
        if self.closed_reason is None:
            self.closed_reason = "closed by this client"
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._protocol.wait_closed_or_abort()

    async def __aenter__(self) -> ServerConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
