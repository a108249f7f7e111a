"""The daemons' HTTP ports (metrics and probes), hardened against slow or hostile peers.

aiohttp serves the requests; this module owns the listening socket and wraps each of
aiohttp's connection handlers:

- a connection cap, counted from accept (before a TLS handshake, which must end within
  ``answer_timeout``). At the cap a new connection takes the slot of the one quiet the
  longest: idle (nothing asked since it connected or was last answered) first, else the
  one whose request has waited longest. A probe asks at once and is answered in
  milliseconds, so connections held open by a peer can no longer keep it out (with all
  256 slots held, /healthz failed 9 probes in 10 and Kubernetes would restart a healthy
  daemon);
- an idle deadline: a connection that asks nothing for ``keepalive_timeout`` after it
  connected or was last answered is closed (aiohttp's own keep-alive deadline, an hour
  by default, is set to the same);
- an answer deadline: a request's first byte must be answered within ``answer_timeout``
  (its head arriving at 1 byte/s is slow-loris; the daemons' handlers answer in
  milliseconds);
- a malformed request is logged as one rate-limited WARNING, not an ERROR traceback.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from .listener import listen
from .peer_warnings import PeerWarnings

log = logging.getLogger(__name__)
peer_warnings = PeerWarnings(log)


@dataclass(frozen=True, slots=True)
class HttpLimits:
    max_connections: int = 256
    answer_timeout: float = 10.0  # from a request's first byte to the first byte answered
    keepalive_timeout: float = 30.0  # asking nothing this long after connecting or an answer
    max_line_size: int = 8190
    max_field_size: int = 8190
    max_headers: int = 64


class _WatchedTransport:
    """The transport as aiohttp sees it: writes are noted, everything else delegated."""

    def __init__(self, transport: asyncio.Transport, on_write: Callable[[], None]) -> None:
        self._transport = transport
        self._on_write = on_write

    def write(self, data: Any) -> None:
        self._on_write()
        self._transport.write(data)

    def writelines(self, data: Any) -> None:
        self._on_write()
        self._transport.writelines(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class GuardedHttpConnection(asyncio.Protocol):
    def __init__(self, guard: HttpGuard, handler: asyncio.Protocol) -> None:
        self._guard = guard
        self._handler = handler
        self._transport: asyncio.Transport | None = None
        self._accepted: asyncio.BaseTransport | None = None  # TCP, before any TLS
        self._counted = False
        self._handed = False  # aiohttp's handler has the connection
        self.waiting_since: float | None = None  # bytes received and not yet answered
        self.quiet_since = time.monotonic()  # connected, or last answered
        self.peer = "?"

    def accepted(self, transport: asyncio.BaseTransport) -> bool:
        """Up in TCP (before any TLS handshake): counted in, perhaps in another's slot."""
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self._guard.admit(self)
        self._counted = True
        self._accepted = transport
        return True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._counted:
            self.accepted(transport)
        self._transport = transport  # type: ignore[assignment]
        watched = _WatchedTransport(transport, self._answered)  # type: ignore[arg-type]
        self._handed = True
        self._handler.connection_made(watched)  # type: ignore[arg-type]

    def _answered(self) -> None:
        self.waiting_since = None
        self.quiet_since = time.monotonic()

    def data_received(self, data: bytes) -> None:
        if self.waiting_since is None:
            self.waiting_since = time.monotonic()
        self._handler.data_received(data)

    def eof_received(self) -> bool | None:
        return self._handler.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._guard.connections.pop(self, None)
        self._transport = self._accepted = None
        if self._handed:  # not when its TLS handshake failed: aiohttp never saw it
            self._handed = False
            self._handler.connection_lost(exc)

    def pause_writing(self) -> None:
        self._handler.pause_writing()

    def resume_writing(self) -> None:
        self._handler.resume_writing()

    def close_for(self, reason: str) -> None:
        peer_warnings.warning("closing HTTP connection from %s: %s", self.peer, reason)
        transport = self._transport or self._accepted  # perhaps in its TLS handshake
        if transport is not None:
            cast(asyncio.Transport, transport).abort()  # the TCP connection's


def quietest(conns: Iterable[GuardedHttpConnection]) -> GuardedHttpConnection | None:
    """Whose slot a newcomer takes at the cap: the connection idle the longest (nothing
    asked since it connected or was last answered), else the one whose request has
    waited longest. A probe asks at once and is answered at once, so it is never it."""
    idle = [c for c in conns if c.waiting_since is None]
    if idle:
        return min(idle, key=lambda c: c.quiet_since)
    return min(conns, key=lambda c: c.waiting_since or 0.0, default=None)


class HttpGuard:
    def __init__(self, limits: HttpLimits) -> None:
        self.limits = limits
        self.connections: dict[GuardedHttpConnection, None] = {}

    def admit(self, conn: GuardedHttpConnection) -> None:
        """Count ``conn`` in; at the cap, in the quietest connection's slot."""
        if len(self.connections) >= self.limits.max_connections:
            victim = quietest(self.connections)
            if victim is not None:
                del self.connections[victim]
                victim.close_for(
                    f"its slot went to a new connection from {conn.peer} "
                    f"({len(self.connections) + 1} open, max_connections)"
                )
        self.connections[conn] = None

    async def sweep(self, every: float = 1.0) -> None:
        limits = self.limits
        while True:
            await asyncio.sleep(every)
            now = time.monotonic()
            for conn in list(self.connections):
                since = conn.waiting_since
                if since is not None and now - since > limits.answer_timeout:
                    conn.close_for(
                        f"a request unanswered {now - since:.0f} s after its first byte "
                        f"(answer_timeout {limits.answer_timeout:g} s)"
                    )
                elif since is None and now - conn.quiet_since > limits.keepalive_timeout:
                    conn.close_for(
                        f"nothing asked for {now - conn.quiet_since:.0f} s "
                        f"(keepalive_timeout {limits.keepalive_timeout:g} s)"
                    )


class _MalformedRequests(logging.Filter):
    """aiohttp logs a malformed request as an ERROR with a traceback; make it one
    rate-limited WARNING line naming the problem."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            peer_warnings.warning("malformed HTTP request: %s", exc.message or exc)
            return False
        return True


_malformed_filter = _MalformedRequests()


class GuardedSite:
    """A running HTTP listener: the aiohttp runner, our server and its sweeper."""

    def __init__(self, runner: web.AppRunner, server: asyncio.Server, guard: HttpGuard) -> None:
        self.runner = runner
        self.server = server
        self.guard = guard
        self._sweeper = asyncio.get_running_loop().create_task(guard.sweep())

    @property
    def port(self) -> int:
        return cast(int, self.server.sockets[0].getsockname()[1])

    async def cleanup(self) -> None:
        self._sweeper.cancel()
        self.server.close()
        for conn in list(self.guard.connections):
            conn.close_for("shutting down")
        await self.runner.cleanup()


async def start_guarded_http(
    app: web.Application,
    host: str,
    port: int,
    limits: HttpLimits | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> GuardedSite:
    """Serve ``app`` on ``host:port`` (0: any) behind the guard; HTTPS with
    ``ssl_context``."""
    limits = limits or HttpLimits()
    logging.getLogger("aiohttp.server").addFilter(_malformed_filter)
    runner = web.AppRunner(
        app,
        access_log=None,
        keepalive_timeout=limits.keepalive_timeout,
        max_line_size=limits.max_line_size,
        max_field_size=limits.max_field_size,
        max_headers=limits.max_headers,
    )
    await runner.setup()
    aiohttp_server = runner.server
    assert aiohttp_server is not None
    guard = HttpGuard(limits)
    server = await listen(
        lambda: GuardedHttpConnection(guard, aiohttp_server()),
        host,
        port,
        ssl_context=ssl_context,
        handshake_timeout=limits.answer_timeout,
    )
    return GuardedSite(runner, server, guard)
