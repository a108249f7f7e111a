"""A daemon's listening port, where every connection counts from the moment it is
accepted: before its TLS handshake, which has a deadline of its own.

asyncio's ``create_server(ssl=...)`` hands a connection to its protocol only once the
TLS handshake is done, and forgets it silently when the handshake fails: until then
the daemon cannot count it, cap it or close it, so 3,000 idle TCP connections on a TLS
port were all held (over a cap of 1,024), and a handshake trickled byte by byte lived
for asyncio's default of 60 s. Here the port listens in plain TCP; each connection is
offered to its handler at once (``accepted``: the handler's guard counts it or refuses
it; without TLS the handler's ``connection_made`` calls it), then upgraded with
``loop.start_tls`` under ``ssl_handshake_timeout``, and only then given to the handler
as its transport (``connection_made``). A failed or late handshake ends in the
handler's ``connection_lost``, so the guard forgets it.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, cast

from .peer_warnings import PeerWarnings

if TYPE_CHECKING:
    from .settings import Setting

log = logging.getLogger(__name__)
peer_warnings = PeerWarnings(log)

# What the TLS layer may decrypt into at once (a plain socket read is as large).
SCRATCH_BYTES = 256 * 1024


class AcceptingProtocol(Protocol):
    """What a handler offers the listener, besides ``asyncio.Protocol``'s methods."""

    def accepted(self, transport: asyncio.BaseTransport) -> bool:
        """The TCP connection is up (no TLS yet): counted in, or False (refused)."""
        ...

    def connection_made(self, transport: asyncio.BaseTransport) -> None: ...
    def data_received(self, data: bytes) -> None: ...
    def eof_received(self) -> bool | None: ...
    def connection_lost(self, exc: Exception | None) -> None: ...
    def pause_writing(self) -> None: ...
    def resume_writing(self) -> None: ...


async def listen(
    factory: Callable[[], Any],
    host: str,
    port: int,
    *,
    ssl_context: ssl.SSLContext | None = None,
    handshake_timeout: float = 10.0,
) -> asyncio.Server:
    """Listen on ``host:port`` for ``factory``'s handlers (``AcceptingProtocol``); over
    TLS with ``ssl_context``, each handshake within ``handshake_timeout`` seconds."""
    loop = asyncio.get_running_loop()
    if ssl_context is None:  # the handler's connection_made calls its accepted() first
        return await loop.create_server(factory, host, port, reuse_address=True)
    scratch = memoryview(bytearray(SCRATCH_BYTES))  # this listener's loop only
    return await loop.create_server(
        lambda: _TlsAcceptor(factory(), ssl_context, handshake_timeout, scratch),
        host,
        port,
        reuse_address=True,
    )


class _After(asyncio.Protocol):
    """Holds what the TLS layer delivers between the end of the handshake and the
    moment the handler takes over (one loop turn: at most a read or two), and passes on
    what comes after (the TLS layer may have scheduled a call to it already)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []
        self.target: _Decrypted | None = None

    def data_received(self, data: bytes) -> None:
        if self.target is not None:
            self.target.data_received(data)
        else:
            self.events.append(("data", data))

    def eof_received(self) -> bool | None:
        if self.target is not None:
            return self.target.eof_received()
        self.events.append(("eof", None))
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.target is not None:
            self.target.connection_lost(exc)
        else:
            self.events.append(("lost", exc))


class _TlsAcceptor(asyncio.Protocol):
    """A TLS connection from accept until its handler takes over.

    The event loop starts reading a new connection as soon as ``connection_made``
    returns (uvloop does so even if it paused), before ``start_tls`` can take the
    transport over; what arrives meanwhile (the ClientHello) is kept and handed to the
    TLS layer before its handshake starts."""

    def __init__(
        self,
        handler: AcceptingProtocol,
        context: ssl.SSLContext,
        timeout: float,
        scratch: memoryview,
    ) -> None:
        self._handler = handler
        self._context = context
        self._timeout = timeout
        self._scratch = scratch
        self._task: asyncio.Task[None] | None = None
        self._transport: asyncio.Transport | None = None
        self._early: list[bytes] = []  # received before the TLS layer took over
        self._over = False  # the handler has had its connection_lost (or never counted)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._handler.accepted(transport):
            self._over = True
            cast(asyncio.Transport, transport).abort()  # the TCP connection
            return
        self._transport = transport  # type: ignore[assignment]
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._handshake(transport))  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:
        self._early.append(data)
        if self._transport is not None:
            self._transport.pause_reading()  # start_tls reads on

    def eof_received(self) -> bool:
        return True  # the handshake, starting, will find the stream ended

    def connection_lost(self, exc: Exception | None) -> None:
        # Lost before start_tls took the transport over.
        if self._task is not None:
            self._task.cancel()
        self._lost(exc)

    def _lost(self, exc: Exception | None) -> None:
        if not self._over:
            self._over = True
            self._handler.connection_lost(exc)

    async def _handshake(self, transport: asyncio.Transport) -> None:
        loop = asyncio.get_running_loop()
        # Runs after start_tls has made the TLS layer the transport's protocol, and
        # before that layer's connection_made starts the handshake.
        loop.call_soon(self._hand_early_bytes, transport)
        after = _After()
        try:
            app = await loop.start_tls(
                transport,
                after,
                self._context,
                server_side=True,
                ssl_handshake_timeout=self._timeout,
            )
        except asyncio.CancelledError:
            transport.abort()
            self._lost(None)
            raise
        except Exception as e:  # refused certificate, not TLS, late, reset
            peer = transport.get_extra_info("peername")
            peer_warnings.warning(
                "TLS handshake with %s failed: %s",
                f"{peer[0]}:{peer[1]}" if peer else "?",
                _describe(e, self._timeout),
            )
            transport.abort()
            self._lost(e if isinstance(e, OSError) else None)
            return
        if self._over or app is None:  # closed by the guard meanwhile
            if app is not None:
                app.abort()
            return
        decrypted = _Decrypted(self._handler, self._scratch)
        app.set_protocol(decrypted)
        self._handler.connection_made(app)
        after.target = decrypted
        for kind, value in after.events:
            if kind == "data":
                self._handler.data_received(value)
            elif kind == "eof":
                if not self._handler.eof_received():
                    app.close()
            else:
                self._lost(value)

    def _hand_early_bytes(self, transport: asyncio.Transport) -> None:
        early, self._early = b"".join(self._early), []
        tls_layer = transport.get_protocol()
        if not early or tls_layer is self:
            return
        view = memoryview(early)
        while view:  # the TLS layer is a BufferedProtocol (asyncio's and uvloop's)
            buffer = tls_layer.get_buffer(len(view))  # type: ignore[attr-defined]
            n = min(len(buffer), len(view))
            buffer[:n] = view[:n]
            tls_layer.buffer_updated(n)  # type: ignore[attr-defined]
            view = view[n:]


class _Decrypted(asyncio.BufferedProtocol):
    """Between the TLS layer and a handler: what the layer decrypts in one go lands in
    the listener's scratch buffer and goes on as one bytes object, as a plain socket
    read does. Handed to a plain protocol, the layer (asyncio's and uvloop's) reads
    16 KiB records one by one and joins them, and the records freed while the joined
    reads stayed buffered left glibc's heap so fragmented that 60 MiB of partial frames
    took 104 MiB of RSS (measured); this way, 65 to 67 MiB."""

    __slots__ = ("_handler", "_scratch")

    def __init__(self, handler: AcceptingProtocol, scratch: memoryview) -> None:
        self._handler = handler
        self._scratch = scratch

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._scratch

    def buffer_updated(self, nbytes: int) -> None:
        # Copied out before the handler runs: the next read may reuse the buffer.
        self._handler.data_received(bytes(self._scratch[:nbytes]))

    def data_received(self, data: bytes) -> None:
        # What _After passes on (a BufferedProtocol has no data_received of its own).
        self._handler.data_received(data)

    def eof_received(self) -> bool | None:
        return self._handler.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._handler.connection_lost(exc)

    def pause_writing(self) -> None:
        self._handler.pause_writing()

    def resume_writing(self) -> None:
        self._handler.resume_writing()


def _describe(e: BaseException, timeout: float) -> str:
    if isinstance(e, (TimeoutError, asyncio.TimeoutError)):
        return f"not done within {timeout:g} s (handshake_timeout)"
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def address_settings(*, port: int, http_port: int, port_is: str) -> list[Setting]:
    """The daemon settings (both daemons) of where it listens: the protocol port
    (``port_is`` names it in the help: "client port") and the HTTP port, with defaults."""
    from .settings import Setting, host_name, int_in

    return [
        Setting("host", host_name, "0.0.0.0", "address to listen on"),
        Setting("port", int_in(0, 65535), port, f"{port_is} (0: any free port)"),
        Setting(
            "http_port",
            int_in(0, 65535),
            http_port,
            "health and metrics port (0: any free port)",
        ),
    ]
