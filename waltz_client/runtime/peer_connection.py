"""A daemon's connection from a peer, guarded and framed: what the storage node's and the
server's connections do alike.

From accept to close: a slot of the daemon's ``PeerGuard`` (``peer_limits``), taken before
any TLS handshake (``listener``), or the connection is refused; with TLS, the peer's
certificate identity; the hello and its negotiation; frames decoded as they arrive and kept,
in order, until the daemon takes them (``_take``), each partial frame reported to the guard;
the socket read only while the daemon has no reason to stop; a malformed frame or a broken
deadline closes this connection only, with one rate-limited WARNING saying why.

What differs stays with the daemon: what its frames mean, what stops it reading, what it
counts in its metrics and how its log lines name a connection.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, cast

from waltz_client.wire.errors import ProtocolError
from waltz_client.wire.framing import (
    HANDSHAKE_BYTES,
    FrameDecoder,
    HandshakeStatus,
    Hello,
    Service,
    negotiate,
)

from .peer_limits import FrameProgress, PeerGuard
from .peer_warnings import PeerWarnings
from .tls import peer_identity


@dataclass(frozen=True, slots=True)
class ErrorKinds:
    """What a daemon's error metric calls each way a peer's connection goes wrong."""

    refused: str  # no slot: over a connection cap
    late: str  # broke a deadline, or gave its slot to a newcomer
    bad_handshake: str  # a hello that does not decode, or speaks nothing we do
    malformed: str  # a frame that does not decode
    unauthorized: str  # a certificate identity not let in


class PeerConnection(asyncio.Protocol, abc.ABC):
    # Each daemon's: its rate-limited warnings (its own logger), how its log lines name a
    # connection ("client connection", "connection from"), the protocol it speaks, and the
    # names of its errors.
    peer_warnings: ClassVar[PeerWarnings]
    log_name: ClassVar[str]
    service: ClassVar[Service]
    protocol_versions: ClassVar[range]
    errors: ClassVar[ErrorKinds]

    # Slots, not a dict an instance: a server holds a connection per client.
    __slots__ = (
        "__weakref__",
        "_accepted",
        "_admitted",
        "_backlog",
        "_closed",
        "_decoder",
        "_frame",
        "_guard",
        "_hello",
        "_on_error",
        "_ready",
        "_socket_paused",
        "_transport",
        "_unready_max_frame_bytes",
        "_write_buffer_bytes",
        "address",
        "connected_at",
        "identity",
        "peer",
        "version",
    )

    def __init__(
        self,
        guard: PeerGuard,
        on_error: Callable[[str], None],
        write_buffer_bytes: int,
        unready_max_frame_bytes: int,
    ) -> None:
        self._guard = guard
        self._on_error = on_error  # counts an error by its kind
        self._write_buffer_bytes = write_buffer_bytes  # unsent bytes before pause_writing()
        self._unready_max_frame_bytes = unready_max_frame_bytes  # until the daemon says more
        self._frame = FrameProgress(guard, self)
        self.connected_at = time.monotonic()  # accepted (the listener makes us then)
        self.peer = "?"
        self.address = "?"
        self.identity: str | None = None  # from the peer's verified certificate
        self._admitted = False  # holds a slot of the guard (from accept, before TLS)
        self._accepted: asyncio.Transport | None = None  # the TCP transport, TLS or not
        self._transport: asyncio.Transport | None = None
        self._ready = False  # past the hello and what the daemon asks first
        self._closed = False
        self._hello = bytearray()
        self.version = 0  # the protocol version the hello settled on (0 before)
        self._decoder: FrameDecoder | None = None  # after the hello
        # Frames received but not yet taken: one socket read can hold hundreds of
        # requests, and they wait here (the socket unread) while something says stop.
        # None while empty: an empty deque is 760 bytes, and an idle connection has none.
        self._backlog: collections.deque[tuple[int, bytes]] | None = None
        self._socket_paused = False

    # --- what the daemon decides ---------------------------------------------------------

    @abc.abstractmethod
    def _take(self, message_type: int, body: bytes) -> None:
        """Decode and act on one frame received (raises ProtocolError if it is malformed)."""

    @abc.abstractmethod
    def _holds_reading(self) -> bool:
        """Whether a reason of the daemon's stops this connection's socket being read."""

    @abc.abstractmethod
    def _holds_frames(self) -> bool:
        """Whether a reason of the daemon's stops the frames received being taken."""

    @abc.abstractmethod
    def over_budget(self, over: bool) -> None:
        """The guard says the partial frames of all connections are over (or back under)
        its budget: stop reading this connection's socket, or read it again."""

    def _may_take_frames(self) -> bool:
        """Whether the frames just received may be taken now (False: it closed)."""
        return True

    def _identity_refusal(self) -> str | None:
        """Why the peer's certificate identity is not let in, or None."""
        return None

    def _tell_malformed(self, reason: str) -> None:
        """Tell the peer why its input is refused, where its protocol has a message for
        that (by default none: the reason is logged only)."""

    # --- what the daemon-wide guard needs ------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def partial(self) -> int:
        return self._frame.partial

    @property
    def partial_since(self) -> float | None:
        return self._frame.since

    @property
    def reading_paused(self) -> bool:
        return self._socket_paused

    @property
    def closed(self) -> bool:
        return self._closed

    def close_for(self, reason: str) -> None:
        """Drop a connection that broke a deadline or gave its slot up (perhaps still in
        its TLS handshake)."""
        self._on_error(self.errors.late)
        self._warn("closing", reason)
        transport = self._transport or self._accepted
        if transport is not None:
            transport.abort()
        self._closed = True

    def _become_ready(self) -> None:
        """Past what the daemon asks first: its slot is its own from now on."""
        self._ready = True
        self._guard.ready(self)

    # --- asyncio.Protocol ---------------------------------------------------------------

    def accepted(self, transport: asyncio.BaseTransport) -> bool:
        """The TCP connection is up (before any TLS handshake): take a slot, or refuse."""
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.address = str(peer[0]) if peer else "?"
        refusal = self._guard.admit(self)
        if refusal is not None:
            self._on_error(self.errors.refused)
            self._warn("refusing", refusal)
            self._closed = True
            return False
        self._admitted = True
        self._accepted = _transport(transport)
        return True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._admitted and not self.accepted(transport):
            _transport(transport).abort()
            return
        self._transport = _transport(transport)
        self.identity = peer_identity(transport)
        refusal = self._identity_refusal()
        if refusal is not None:
            self._on_error(self.errors.unauthorized)
            self._warn("refusing", refusal)
            self._transport.abort()
            return
        # Above this many unsent bytes, pause_writing() stops the daemon taking requests.
        self._transport.set_write_buffer_limits(high=self._write_buffer_bytes)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._transport = None
        self._accepted = None
        self._backlog = None
        if self._admitted:
            self._guard.forget(self, self._frame.partial)
        # The partial frame goes now, not when the cyclic collector finds this object (it
        # and its FrameProgress refer to each other): frames read after 12 peers closed
        # kept 168 MiB held for good.
        self._decoder = None
        self._hello = bytearray()

    def eof_received(self) -> bool:
        """The peer finished sending: a partial frame left in the buffer is a malformed one."""
        if self._decoder is not None and self._decoder.buffered:
            self._reject(
                f"MalformedFrame: truncated frame: the stream ended inside it "
                f"after {self._decoder.buffered} bytes"
            )
        return False  # close our side too

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        if self._decoder is None:
            self._handshake(data)
            return
        try:
            frames = self._decoder.feed(data)
            if frames:
                if self._backlog is None:
                    self._backlog = collections.deque(frames)
                else:
                    self._backlog.extend(frames)
            self._frame.update(self._decoder.buffered)
        except ProtocolError as e:
            self._reject(f"{type(e).__name__}: {e}")
            return
        if self._may_take_frames():
            self._work_through_backlog()

    # --- frames in, reading, closing ---------------------------------------------------------

    def _handshake(self, data: bytes) -> None:
        self._hello += data
        if len(self._hello) < HANDSHAKE_BYTES:
            return
        transport = self._transport
        assert transport is not None
        try:
            hello = Hello.decode(bytes(self._hello[:HANDSHAKE_BYTES]))
        except ProtocolError as e:
            self._refuse_handshake(f"handshake: {e}")
            return
        reply = negotiate(hello, self.service, self.protocol_versions)
        transport.write(reply.encode())
        if reply.status != HandshakeStatus.OK:
            self._refuse_handshake(
                f"handshake {reply.status.name} ({hello.service.name} "
                f"{hello.min_version}..{hello.max_version})"
            )
            return
        self.version = reply.version
        self._decoder = FrameDecoder(self._unready_max_frame_bytes)
        rest = bytes(self._hello[HANDSHAKE_BYTES:])
        self._hello = bytearray()
        if rest:
            self.data_received(rest)

    def _work_through_backlog(self) -> None:
        """Take the frames received, in order, until something says stop; the rest wait,
        and the socket is not read meanwhile."""
        backlog = self._backlog
        try:
            while backlog and not self._closed and not self._holds_frames():
                message_type, body = backlog.popleft()
                self._take(message_type, body)
        except ProtocolError as e:
            self._reject(f"{type(e).__name__}: {e}")
            return
        finally:
            if not backlog and self._backlog is backlog:
                self._backlog = None
        self._update_reading()

    def _update_reading(self) -> None:
        """Read the socket only while nothing says stop and no received frame waits."""
        transport = self._transport
        if transport is None or self._closed or transport.is_closing():
            return
        stop = self._holds_reading() or bool(self._backlog)
        if stop and not self._socket_paused:
            self._socket_paused = True
            transport.pause_reading()
        elif not stop and self._socket_paused:
            self._socket_paused = False
            transport.resume_reading()
            self._frame.restart_clock()  # a frame's deadline counts while we read

    def _refuse_handshake(self, reason: str) -> None:
        self._on_error(self.errors.bad_handshake)
        self._warn("closing", reason)
        self.close()

    def _reject(self, reason: str) -> None:
        """Malformed input: say why, then close this connection only."""
        self._on_error(self.errors.malformed)
        self._warn("closing", reason)
        self._tell_malformed(reason)
        self.close()

    def close(self) -> None:
        """Close once what was written has gone, and take nothing more meanwhile."""
        if self._transport is not None:
            self._transport.close()
        self._closed = True
        self._decoder = None  # buffered input dropped
        self._backlog = None

    def hang_up(self) -> None:
        """The daemon stops: close whatever transport the connection has, the TLS one or,
        while its TLS handshake runs, the TCP one."""
        transport = self._transport or self._accepted
        if transport is not None:
            transport.close()

    def _warn(self, action: str, reason: str) -> None:
        self.peer_warnings.warning("%s %s %s: %s", action, self.log_name, self.peer, reason)


def _transport(transport: asyncio.BaseTransport) -> asyncio.Transport:
    """A stream transport (uvloop's has every method of asyncio's without subclassing it)."""
    return cast(asyncio.Transport, transport)
