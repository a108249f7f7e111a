"""The daemons' HTTP ports (metrics and probes), hardened against slow or hostile peers.

aiohttp serves the requests; this module owns the listening socket and wraps each of
aiohttp's connection handlers:

- a connection cap: beyond it, a connection is dropped at once;
- an answer deadline: a request's first byte must be answered within ``answer_timeout``
  (its head arriving at 1 byte/s is slow-loris; the daemons' handlers answer in
  milliseconds);
- an idle keep-alive deadline (aiohttp's ``keepalive_timeout``, an hour by default);
- a malformed request is logged as one rate-limited WARNING, not an ERROR traceback.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from .peer_warnings import PeerWarnings

log = logging.getLogger(__name__)
peer_warnings = PeerWarnings(log)


@dataclass(frozen=True, slots=True)
class HttpLimits:
    max_connections: int = 256
    answer_timeout: float = 10.0  # from a request's first byte to the first byte answered
    keepalive_timeout: float = 30.0  # an idle kept-alive connection is closed after it
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
        self.waiting_since: float | None = None  # bytes received and not yet answered
        self.peer = "?"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        if not self._guard.admit(self):
            peer_warnings.warning(
                "refusing HTTP connection from %s: %d open (max_connections)",
                self.peer,
                len(self._guard.connections),
            )
            transport.abort()
            return
        self._transport = transport  # type: ignore[assignment]
        watched = _WatchedTransport(transport, self._answered)  # type: ignore[arg-type]
        self._handler.connection_made(watched)  # type: ignore[arg-type]

    def _answered(self) -> None:
        self.waiting_since = None

    def data_received(self, data: bytes) -> None:
        if self.waiting_since is None:
            self.waiting_since = time.monotonic()
        self._handler.data_received(data)

    def eof_received(self) -> bool | None:
        return self._handler.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._transport is None:
            return  # refused: aiohttp never saw it
        self._guard.connections.discard(self)
        self._transport = None
        self._handler.connection_lost(exc)

    def pause_writing(self) -> None:
        self._handler.pause_writing()

    def resume_writing(self) -> None:
        self._handler.resume_writing()

    def close_for(self, reason: str) -> None:
        peer_warnings.warning("closing HTTP connection from %s: %s", self.peer, reason)
        if self._transport is not None:
            self._transport.abort()


class HttpGuard:
    def __init__(self, limits: HttpLimits) -> None:
        self.limits = limits
        self.connections: set[GuardedHttpConnection] = set()

    def admit(self, conn: GuardedHttpConnection) -> bool:
        if len(self.connections) >= self.limits.max_connections:
            return False
        self.connections.add(conn)
        return True

    async def sweep(self, every: float = 1.0) -> None:
        while True:
            await asyncio.sleep(every)
            now = time.monotonic()
            for conn in list(self.connections):
                since = conn.waiting_since
                if since is not None and now - since > self.limits.answer_timeout:
                    conn.close_for(
                        f"a request unanswered {now - since:.0f} s after its first byte "
                        f"(answer_timeout {self.limits.answer_timeout:g} s)"
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
        return self.server.sockets[0].getsockname()[1]

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
    server = await asyncio.get_running_loop().create_server(
        lambda: GuardedHttpConnection(guard, aiohttp_server()),
        host,
        port,
        reuse_address=True,
        ssl=ssl_context,
    )
    return GuardedSite(runner, server, guard)
