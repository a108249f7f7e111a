"""Bounds a daemon keeps on its peers' connections, shared by the storage node and the
server: a connection cap and a cap per peer address, counted from accept (before any
TLS handshake); a deadline to become ready (the TLS handshake, the hello, and Open on
storage or the first request on a server); a deadline to finish a frame once started
(slow-loris); and a daemon-wide budget for frames partly received on all connections
together.

A connection that is not ready yet holds its slot only until a new connection needs
it: at either cap, the newcomer takes the slot of the oldest connection not yet ready
(of its own address at the address cap; else of the address holding the most such
connections). Ready connections are never displaced, so connections that never get
past the handshake cannot lock out a peer that does, as PostgreSQL keeps
``superuser_reserved_connections`` for those who authenticate.

``PeerGuard`` holds the daemon-wide state; each connection reports to it and obeys
``over_budget``. The decisions (``SlotTable``: who gets a slot and whose it is;
``broken_deadline``; which connection the budget stops or lets through) are plain code
over the connections' reported state.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import KeysView
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from .memory_trim import MemoryTrimmer

if TYPE_CHECKING:
    from .settings import Setting

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class PeerLimits:
    max_connections: int = 1024
    # One address may hold at most this many (a pod's IP; many clients behind a NAT share one).
    max_connections_per_address: int = 256
    handshake_timeout: float = 10.0  # seconds from connecting to being ready
    partial_frame_timeout: float = 60.0  # seconds a started frame may take to finish
    partial_frames_max_bytes: int = 256 * MiB  # all connections' partial frames together


class GuardedConnection(Protocol):
    connected_at: float
    address: str  # the peer's IP address

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


C = TypeVar("C")


class SlotTable(Generic[C]):
    """Who holds the connection slots, by address, and who gets one: pure bookkeeping.

    ``admit`` decides for a newcomer: a slot if both caps allow it; else, at the address
    cap, the slot of its own address's oldest connection not yet ready; at the total
    cap, that of the oldest connection not yet ready of the address holding the most
    of them (a legitimate peer has at most a few connections in its handshake at once,
    so a flood from other addresses gives up its own slots first); else nothing."""

    def __init__(self, max_total: int, max_per_address: int) -> None:
        self.max_total = max_total
        self.max_per_address = max_per_address
        self.holders: dict[C, str] = {}  # connection -> address, oldest first
        self._per_address: dict[str, int] = {}
        self._unready: dict[str, dict[C, None]] = {}  # per address, oldest first

    def __len__(self) -> int:
        return len(self.holders)

    def __contains__(self, conn: object) -> bool:
        return conn in self.holders

    def at(self, address: str) -> int:
        return self._per_address.get(address, 0)

    @property
    def unready(self) -> int:
        return sum(len(conns) for conns in self._unready.values())

    def admit(self, conn: C, address: str) -> tuple[list[C], str | None]:
        """Give ``conn`` (not ready) a slot: (the connections it displaces, which the
        caller closes; None) or ([], why it is refused)."""
        displaced: list[C] = []
        held = self.at(address)
        if held >= self.max_per_address:
            victim = self._oldest_unready(address)
            if victim is None:
                return [], (
                    f"{held} ready connections from {address} (max_connections_per_address)"
                )
            self.release(victim)
            displaced.append(victim)
        if len(self.holders) >= self.max_total:
            victim = self._victim()
            if victim is None:
                return [], f"{len(self.holders)} ready connections (max_connections)"
            self.release(victim)
            displaced.append(victim)
        self.holders[conn] = address
        self._per_address[address] = self.at(address) + 1
        self._unready.setdefault(address, {})[conn] = None
        return displaced, None

    def ready(self, conn: C) -> None:
        """``conn`` got past its handshake (and Open): its slot is its own from now on."""
        address = self.holders.get(conn)
        if address is not None:
            self._drop_unready(address, conn)

    def release(self, conn: C) -> bool:
        """Free ``conn``'s slot; False if it held none (refused, or released already)."""
        address = self.holders.pop(conn, None)
        if address is None:
            return False
        left = self._per_address[address] - 1
        if left:
            self._per_address[address] = left
        else:
            del self._per_address[address]
        self._drop_unready(address, conn)
        return True

    def _drop_unready(self, address: str, conn: C) -> None:
        conns = self._unready.get(address)
        if conns is not None and conn in conns:
            del conns[conn]
            if not conns:
                del self._unready[address]

    def _oldest_unready(self, address: str) -> C | None:
        conns = self._unready.get(address)
        return next(iter(conns)) if conns else None

    def _victim(self) -> C | None:
        """The oldest connection not yet ready of the address holding the most of them
        (the first such address seen, on a tie)."""
        best: dict[C, None] | None = None
        for conns in self._unready.values():
            if best is None or len(conns) > len(best):
                best = conns
        return next(iter(best)) if best else None


class PeerGuard:
    def __init__(
        self, limits: PeerLimits, ready_means: str, max_frame_bytes: int | None = None
    ) -> None:
        self.limits = limits
        self.ready_means = ready_means  # for messages: "successful Open", "handshake"
        self.slots: SlotTable[GuardedConnection] = SlotTable(
            limits.max_connections,
            min(limits.max_connections_per_address, limits.max_connections),
        )
        self.partial_bytes = 0
        # Frames stop being read past ``pause_above``: what is left of the budget is room
        # for the one frame let through to finish, so that together they stay within it.
        budget = limits.partial_frames_max_bytes
        frame = max_frame_bytes if max_frame_bytes is not None else budget // 2
        self.pause_above = budget - min(frame, budget // 2)
        # Stopped by the budget, oldest first (a dict keeps insertion order).
        self._paused: dict[GuardedConnection, None] = {}
        self._finishing: GuardedConnection | None = None  # reads on past pause_above
        self._sweeper: asyncio.Task[None] | None = None
        # Gives back to the OS what closed connections made the daemon hold.
        self.trimmer = MemoryTrimmer()

    @property
    def connections(self) -> KeysView[GuardedConnection]:
        """The connections holding a slot, oldest first."""
        return self.slots.holders.keys()

    def admit(self, conn: GuardedConnection) -> str | None:
        """Count a new connection in (from accept, before any TLS handshake), closing
        the connections not yet ready whose slots it takes; None, or why it is refused."""
        displaced, refusal = self.slots.admit(conn, conn.address)
        for victim in displaced:
            self._release(victim, victim.partial)
            victim.close_for(
                f"its slot went to a new connection from {conn.address} (not "
                f"{self.ready_means} after {time.monotonic() - victim.connected_at:.1f} s)"
            )
        return refusal

    def ready(self, conn: GuardedConnection) -> None:
        """``conn`` is ready (``ready_means``): its slot is no longer up for the taking."""
        self.slots.ready(conn)

    def forget(self, conn: GuardedConnection, partial: int) -> None:
        """A connection closed holding ``partial`` bytes of a frame."""
        if self._release(conn, partial):
            self.trimmer.soon()

    def _release(self, conn: GuardedConnection, partial: int) -> bool:
        if not self.slots.release(conn):
            return False  # refused, or displaced already
        self._paused.pop(conn, None)
        if self._finishing is conn:
            self._finishing = None
        self.partial_changed(conn, -partial, counted=True)
        return True

    def partial_changed(
        self, conn: GuardedConnection, delta: int, *, counted: bool = False
    ) -> None:
        """Stop reading a connection that grows a partial frame past ``pause_above``;
        resume the stopped ones, oldest first, as the total falls back under it. When
        every partial frame is stopped, the oldest reads on until its frame is complete
        (in the room left below the budget: a frame is bounded by the frame limit), so
        some frame always finishes. ``counted``: ``conn`` has just left the slots."""
        if not counted and conn not in self.slots:
            return  # displaced: its bytes were given back then
        self.partial_bytes += delta
        if self._finishing is not None and (not self._finishing.partial or self._finishing.closed):
            self._finishing = None
        budget = self.pause_above
        paused = self._paused
        if (
            not counted
            and self.partial_bytes > budget
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


def peer_limit_settings() -> list[Setting]:
    """The daemon settings (both daemons) behind PeerLimits."""
    from .settings import Setting, float_in, int_in, size_at_least

    defaults = PeerLimits()
    return [
        Setting(
            "max_connections",
            int_in(1, 1_000_000),
            defaults.max_connections,
            "connections on the protocol port at once, counted from accept; past it a new "
            "one takes the slot of one not yet ready, or is dropped",
        ),
        Setting(
            "max_connections_per_address",
            int_in(1, 1_000_000),
            defaults.max_connections_per_address,
            "connections from one IP address at once (a NAT's clients share one)",
        ),
        Setting(
            "handshake_timeout",
            float_in(0.1, 3600.0),
            defaults.handshake_timeout,
            "seconds a new connection has to become ready: its TLS handshake, hello, and "
            "Open (storage) or first request (server)",
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


def max_frame_setting() -> Setting:
    """The daemon setting (both daemons) bounding a frame from a peer."""
    from .settings import Setting, size_at_least

    return Setting("max_frame_bytes", size_at_least(64 * 1024), "64MiB", "largest frame accepted")


def check_max_frame_bytes(max_frame_bytes: int) -> None:
    """For a daemon's config: a frame's length is a 32-bit field."""
    from .settings import ConfigError

    if max_frame_bytes > 2**32 - 1:
        raise ConfigError("setting max_frame_bytes: must fit the 32-bit frame length")


def peer_limits_of(config: object) -> PeerLimits:
    """PeerLimits from a daemon config holding the peer_limit_settings() fields."""
    return PeerLimits(
        max_connections=config.max_connections,  # type: ignore[attr-defined]
        max_connections_per_address=config.max_connections_per_address,  # type: ignore[attr-defined]
        handshake_timeout=config.handshake_timeout,  # type: ignore[attr-defined]
        partial_frame_timeout=config.partial_frame_timeout,  # type: ignore[attr-defined]
        partial_frames_max_bytes=config.partial_frames_max_bytes,  # type: ignore[attr-defined]
    )
