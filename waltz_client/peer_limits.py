"""Bounds a daemon keeps on its peers' connections, shared by the storage node and the
server: a connection cap, a deadline to become ready (handshake, and Open on storage),
a deadline to finish a frame once started (slow-loris), and a daemon-wide budget for
frames partly received on all connections together.

``PeerGuard`` holds the daemon-wide state; each connection reports to it and obeys
``over_budget``. The decisions (``broken_deadline``, which connection the budget stops or
lets through) are plain code over the connections' reported state.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Protocol

from .memory_trim import MemoryTrimmer

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class PeerLimits:
    max_connections: int = 1024
    handshake_timeout: float = 10.0  # seconds from connecting to being ready
    partial_frame_timeout: float = 60.0  # seconds a started frame may take to finish
    partial_frames_max_bytes: int = 256 * MiB  # all connections' partial frames together


class GuardedConnection(Protocol):
    connected_at: float

    @property
    def partial_since(self) -> float | None: ...  # when the partial frame started

    @property
    def ready(self) -> bool: ...  # past the handshake (and Open on storage)
    @property
    def partial(self) -> int: ...  # bytes of a frame started but not finished
    @property
    def closed(self) -> bool: ...
    @property
    def reading_paused(self) -> bool: ...
    def over_budget(self, over: bool) -> None: ...
    def close_for(self, reason: str) -> None: ...


def broken_deadline(
    conn: GuardedConnection, now: float, limits: PeerLimits, ready_means: str
) -> str | None:
    """Why ``conn`` must be closed now, or None. A frame's deadline runs only while the
    daemon reads the connection: a frame stalled by our own back pressure is not late."""
    if not conn.ready and now - conn.connected_at > limits.handshake_timeout:
        return f"no {ready_means} within {limits.handshake_timeout:g} s of connecting"
    if (
        conn.partial_since is not None
        and not conn.reading_paused
        and now - conn.partial_since > limits.partial_frame_timeout
    ):
        return (
            f"a frame started {now - conn.partial_since:.0f} s ago is still incomplete "
            f"({conn.partial} bytes so far)"
        )
    return None


class PeerGuard:
    def __init__(self, limits: PeerLimits, ready_means: str) -> None:
        self.limits = limits
        self.ready_means = ready_means  # for messages: "successful Open", "handshake"
        self.connections: set[GuardedConnection] = set()
        self.partial_bytes = 0
        # Stopped by the budget, oldest first (a dict keeps insertion order).
        self._paused: dict[GuardedConnection, None] = {}
        self._finishing: GuardedConnection | None = None  # reads on past the budget
        self._sweeper: asyncio.Task[None] | None = None
        # Gives back to the OS what closed connections made the daemon hold.
        self.trimmer = MemoryTrimmer()

    def admit(self, conn: GuardedConnection) -> bool:
        """Count a new connection in; False when the daemon is at its cap."""
        if len(self.connections) >= self.limits.max_connections:
            return False
        self.connections.add(conn)
        return True

    def forget(self, conn: GuardedConnection, partial: int) -> None:
        """A connection closed holding ``partial`` bytes of a frame."""
        self.connections.discard(conn)
        self.partial_changed(conn, -partial)
        self.trimmer.soon()

    def partial_changed(self, conn: GuardedConnection, delta: int) -> None:
        """Stop reading a connection that grows a partial frame past the budget; resume
        the stopped ones, oldest first, as the total falls back under it. When every
        partial frame is stopped, the oldest reads on until its frame is complete (a
        frame is bounded by the frame limit), so some frame always finishes."""
        self.partial_bytes += delta
        if self._finishing is not None and (not self._finishing.partial or self._finishing.closed):
            self._finishing = None
        budget = self.limits.partial_frames_max_bytes
        paused = self._paused
        if (
            self.partial_bytes > budget
            and conn.partial
            and not conn.closed
            and conn is not self._finishing
            and conn not in paused
        ):
            paused[conn] = None
            conn.over_budget(True)
        for c in [c for c in paused if not c.partial or c.closed]:
            del paused[c]
            c.over_budget(False)
        while paused and self.partial_bytes <= budget:
            oldest = next(iter(paused))
            del paused[oldest]
            oldest.over_budget(False)
        if (
            paused
            and self._finishing is None
            and not any(c.partial for c in self.connections if c not in paused)
        ):
            self._finishing = next(iter(paused))
            del paused[self._finishing]
            self._finishing.over_budget(False)

    def start(self, every: float = 1.0) -> None:
        self._sweeper = asyncio.get_running_loop().create_task(self._enforce_deadlines(every))

    async def stop(self) -> None:
        self.trimmer.cancel()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None

    async def _enforce_deadlines(self, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            now = time.monotonic()
            for conn in list(self.connections):
                reason = broken_deadline(conn, now, self.limits, self.ready_means)
                if reason is not None:
                    conn.close_for(reason)


class FrameProgress:
    """One connection's partly received frame, as the guard sees it."""

    __slots__ = ("_conn", "_guard", "partial", "since")

    def __init__(self, guard: PeerGuard, conn: GuardedConnection) -> None:
        self._guard = guard
        self._conn = conn
        self.partial = 0
        self.since: float | None = None

    def update(self, buffered: int) -> None:
        """The decoder now holds ``buffered`` bytes of an unfinished frame."""
        if buffered and not self.partial:
            self.since = time.monotonic()
        elif not buffered:
            self.since = None
        delta, self.partial = buffered - self.partial, buffered
        if delta:
            self._guard.partial_changed(self._conn, delta)

    def restart_clock(self) -> None:
        """Reading resumed: the frame's deadline counts from now."""
        if self.partial:
            self.since = time.monotonic()


def peer_limit_settings() -> list:
    """The daemon settings (both daemons) behind PeerLimits."""
    from .settings import Setting, float_in, int_in, size_at_least

    defaults = PeerLimits()
    return [
        Setting(
            "max_connections",
            int_in(1, 1_000_000),
            defaults.max_connections,
            "connections on the protocol port at once; more are dropped at once",
        ),
        Setting(
            "handshake_timeout",
            float_in(0.1, 3600.0),
            defaults.handshake_timeout,
            "seconds a new connection has to finish its handshake (and Open, on storage)",
        ),
        Setting(
            "partial_frame_timeout",
            float_in(1.0, 3600.0),
            defaults.partial_frame_timeout,
            "seconds a peer has to finish sending a frame it started",
        ),
        Setting(
            "partial_frames_max_bytes",
            size_at_least(1024 * 1024),
            "256MiB",
            "bytes of partly received frames, all connections together",
        ),
    ]


def peer_limits_of(config: object) -> PeerLimits:
    """PeerLimits from a daemon config holding the peer_limit_settings() fields."""
    return PeerLimits(
        max_connections=config.max_connections,  # type: ignore[attr-defined]
        handshake_timeout=config.handshake_timeout,  # type: ignore[attr-defined]
        partial_frame_timeout=config.partial_frame_timeout,  # type: ignore[attr-defined]
        partial_frames_max_bytes=config.partial_frames_max_bytes,  # type: ignore[attr-defined]
    )
