"""What a client connection's certificate identity may do: which client IDs it may use
(on a client port with mutual TLS), and which partitions it may read or append (the
cluster's access policy, ``waltz_client.cluster.access``).

A client gets its ID from a server (``AllocateClientId``); on a mutual-TLS port the ID
is bound to the connection's identity when it is allocated, within a quota per identity
(``waltz_client.cluster.client_ids``). A Mount, Append or Flush under an ID bound to
another identity, or under an ID bound to nobody, is refused: nobody can squat on IDs
they were not given. Servers touch the bindings their connections use and release those
unused for the retention period. Bindings are cached here; ZooKeeper holds the truth.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import TypeVar, TypeVarTuple

from kazoo.client import KazooClient

from waltz_client.cluster.access import Access
from waltz_client.cluster.acl import readopt_open_acl
from waltz_client.cluster.client_ids import (
    allocate_client_id,
    binding_refusal,
    maintenance_interval,
    read_binding,
    release_unused_bindings,
    touch_binding,
    touch_due,
)
from waltz_client.wire.client_messages import (
    AppendRequest,
    ClientMessage,
    FlushRequest,
    MountRequest,
    ReadRangeRequest,
    TransactionDataRequest,
)

# Requests that act as a client (reads and feeds are not tied to a client ID).
ACTS_AS_CLIENT = (AppendRequest, MountRequest, FlushRequest)


def required_access(message: ClientMessage) -> Access:
    """The access a request needs: appending, reading data, or (mounts, feeds, high-water
    marks, flushes: what a client needs to learn what committed) either of them."""
    if isinstance(message, AppendRequest):
        return Access.APPEND
    if isinstance(message, (TransactionDataRequest, ReadRangeRequest)):
        return Access.READ
    return Access.FEED


def refusal(identity: str | None, partition_id: int, access: Access) -> str:
    """The FORBIDDEN error's text."""
    who = f"identity {identity!r}" if identity is not None else "a client without a certificate"
    what = {
        Access.APPEND: "append to",
        Access.READ: "read the data of",
        Access.FEED: "mount or follow",
    }[access]
    return f"{who} may not {what} partition {partition_id} (the cluster's access policy)"


# A WaltzClient asks once; more from one connection are refused (each costs ZooKeeper
# writes, and a client certificate's quota is for clients, not for one connection).
MAX_ALLOCATIONS_PER_CONNECTION = 16

log = logging.getLogger(__name__)

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class ZooKeeperUnavailable(Exception):
    """The server has no ZooKeeper session (starting, or lost it): try again later."""


class ClientBindings:
    """Allocates client IDs and checks, touches and releases their bindings. ZooKeeper calls
    block, so they run in the default executor; ``clock`` is wall time (bindings record
    ZooKeeper's modification time, in ms since the epoch)."""

    def __init__(
        self,
        zk: Callable[[], KazooClient | None],
        root: str,
        *,
        quota: int = 1000,
        retention: float = 7 * 86400.0,
        clock: Callable[[], float] = time.time,
        max_cached: int = 100_000,
    ) -> None:
        self._zk = zk
        self.root = root
        self.quota = quota
        self.retention = retention
        self._clock = clock
        # client ID -> (identity, when read: monotonic); re-read after a maintenance
        # interval, so that a release by another server is seen.
        self._cache: dict[int, tuple[str, float]] = {}
        self._max_cached = max_cached
        self._touched: dict[int, float] = {}  # client ID in use -> its last use we know

    def _session(self) -> KazooClient:
        zk = self._zk()
        if zk is None or not zk.connected:
            raise ZooKeeperUnavailable("the server has no ZooKeeper session yet")
        return zk

    async def _run(self, fn: Callable[[KazooClient, str, *Ts], T], *args: *Ts) -> T:
        zk = self._session()
        return await asyncio.get_running_loop().run_in_executor(None, fn, zk, self.root, *args)

    def _remember(self, client_id: int, identity: str) -> None:
        if client_id not in self._cache and len(self._cache) >= self._max_cached:
            self._cache.pop(next(iter(self._cache)))  # the oldest: ZooKeeper has it
        self._cache[client_id] = (identity, time.monotonic())

    async def allocate(self, identity: str | None) -> int:
        """A fresh client ID, bound to ``identity`` (None: nothing to bind). Raises
        ``ClientIdRefused`` over quota, ``ZooKeeperUnavailable`` without a session."""

        def allocate(zk: KazooClient, root: str) -> int:
            readopt_open_acl(zk, root)  # the cluster may have been secured since
            return allocate_client_id(zk, root, identity, self.quota)

        zk = self._session()
        client_id = await asyncio.get_running_loop().run_in_executor(None, allocate, zk, self.root)
        if identity is not None:
            self._remember(client_id, identity)
            self._touched[client_id] = self._clock()
        return client_id

    async def refusal(self, client_id: int, identity: str) -> str | None:
        """Why ``identity`` may not act as ``client_id`` (None: it may)."""
        known = self._cache.get(client_id)
        if known is None or time.monotonic() - known[1] > maintenance_interval(self.retention):
            found = await self._run(read_binding, client_id)
            if found is None:
                self._cache.pop(client_id, None)
                return binding_refusal(client_id, identity, None)
            bound, last_used = found
            self._remember(client_id, bound)
            if bound == identity:
                self._touched[client_id] = max(self._touched.get(client_id, 0.0), last_used)
            known = self._cache[client_id]
        return binding_refusal(client_id, identity, known[0])

    async def touch(self, in_use: Iterable[tuple[int, str]]) -> int:
        """Mark used now the bindings of (client ID, identity) pairs our connections hold,
        each at most once per maintenance interval; the number touched."""
        now = self._clock()
        using = dict(in_use)
        for client_id in [c for c in self._touched if c not in using]:
            del self._touched[client_id]
        touched = 0
        for client_id, identity in using.items():
            if not touch_due(self._touched.get(client_id), now, self.retention):
                continue
            if await self._run(touch_binding, client_id, identity):
                self._touched[client_id] = now
                touched += 1
            else:  # released (the connection was idle past the retention)
                self._touched.pop(client_id, None)
                self._cache.pop(client_id, None)
        return touched

    async def sweep(self, in_use: Iterable[int] = ()) -> list[int]:
        """Release the bindings unused for the retention period (not those in use here)."""
        keep = set(in_use)
        released = await self._run(release_unused_bindings, self.retention, self._clock(), keep)
        for client_id in released:
            self._cache.pop(client_id, None)
        if released:
            log.info(
                "released %d client IDs unused for %g s (client_id_retention)",
                len(released),
                self.retention,
            )
        return released

    async def maintain(
        self,
        in_use: Callable[[], Iterable[tuple[int, str]]],
        sweeper: Callable[[], bool],
    ) -> None:
        """Forever: touch the bindings in use, and, when ``sweeper()`` (one server of the
        cluster), release the unused ones."""
        while True:
            await asyncio.sleep(maintenance_interval(self.retention))
            try:
                using = list(in_use())
                await self.touch(using)
                if sweeper():
                    await self.sweep(c for c, _ in using)
            except asyncio.CancelledError:
                raise
            except ZooKeeperUnavailable:
                continue
            except Exception as e:  # the next round tries again
                log.warning("maintaining client-ID bindings failed: %s: %s", type(e).__name__, e)
