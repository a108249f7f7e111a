"""One connection to each storage node, shared by all of a server's store sessions.

With a connection per session, every partition's batch was a system call of its own at
the server, a socket read and an answer write of its own at the storage node, and the
partitions' answers reached the server at scattered times. Shared, the batches of all
partitions sent in one loop turn leave in one write (the client corks them), the storage
node reads them together and answers them with one write after its group commit, and
the partitions commit in the same turn. Kafka's producers and replica fetchers share a
connection per broker the same way.

A session acquires the connection of each member and releases it when it ends; the last
release closes it. A member that fails at the connection level (closed, silent past the
storage timeout) is discarded: its connection is closed, so every session on it ends and
the next dials afresh, as a paused or restarted node calls for. An error answer (a fenced
session, a full disk on one partition) is one partition's and leaves the connection be.

Recoveries use a pool of their own (``RecoveryContext.recovery_pool``): they must not
queue behind other partitions' appends, but when many partitions recover at once (a
failover, a rolling restart), they share one connection a node rather than each dialling
three, and over TLS, each one a handshake.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from dataclasses import dataclass

from waltz_client.runtime.tasks import spawn, wait_for
from waltz_client.wire.framing import OpenConnection
from waltz_client.wire.storage_client import StorageClient

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PoolKey:
    address: str  # host:port
    cluster_key: uuid.UUID
    num_partitions: int


class _Entry:
    __slots__ = ("client", "users")

    def __init__(self, client: StorageClient) -> None:
        self.client = client
        self.users = 0


class StoragePool:
    def __init__(self, open_connection: OpenConnection = asyncio.open_connection) -> None:
        self._open_connection = open_connection
        self._entries: dict[PoolKey, _Entry] = {}
        self._dialing: dict[PoolKey, asyncio.Future[_Entry]] = {}
        self._closed = False
        # Kept open with no session on them (``hold``); the tasks dialling them ahead.
        self._held: frozenset[PoolKey] = frozenset()
        self._warming: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        """Open shared connections."""
        return sum(1 for e in self._entries.values() if not e.client.closed)

    async def acquire(self, key: PoolKey, timeout: float) -> StorageClient:
        """The shared, opened connection for ``key``, dialled if there is none (or it
        closed); raises as ``StorageClient.connect`` and ``open`` do. Release it once."""
        if self._closed:
            raise ConnectionError("the storage pool is closed")
        entry = self._entries.get(key)
        if entry is None or entry.client.closed:
            entry = await self._dial(key, timeout)
        entry.users += 1
        return entry.client

    async def _dial(self, key: PoolKey, timeout: float) -> _Entry:
        dialing = self._dialing.get(key)
        if dialing is not None:  # another session is dialling it: share that attempt
            return await asyncio.shield(dialing)
        future: asyncio.Future[_Entry] = asyncio.get_running_loop().create_future()
        self._dialing[key] = future
        try:
            client = await _connect(key, timeout, self._open_connection)
        except BaseException as e:
            future.set_exception(e if isinstance(e, Exception) else ConnectionError(str(e)))
            future.exception()  # retrieved: nobody else may be waiting
            raise
        finally:
            del self._dialing[key]
        old = self._entries.get(key)
        if old is not None:  # closed: its sessions have ended or are ending
            await old.client.close()
        entry = self._entries[key] = _Entry(client)
        if not future.done():
            future.set_result(entry)
        if self._closed:
            await client.close()
        return entry

    async def release(self, key: PoolKey, client: StorageClient) -> None:
        """A session is done with ``client``: the last user closes it."""
        entry = self._entries.get(key)
        if entry is None or entry.client is not client:
            await client.close()  # discarded and replaced meanwhile; make sure it is shut
            return
        entry.users -= 1
        if entry.users <= 0 and key not in self._held:
            del self._entries[key]
            await client.close()

    async def warm(self, keys: set[PoolKey], timeout: float, wait: float) -> None:
        """``hold`` these, and wait until each is dialled or failed, at most ``wait`` s
        (the dials go on)."""
        self.hold(keys, timeout)
        if self._warming:
            await asyncio.wait(set(self._warming), timeout=wait)

    def hold(self, keys: set[PoolKey], timeout: float) -> None:
        """Keep a connection to each of ``keys`` open, dialled now, even while no session
        uses it: a failover or a rolling restart then starts on open connections instead
        of handshakes (with TLS, a few milliseconds of CPU each, a partition each
        before). Connections of keys no longer held close once unused. A dial that fails
        is left to the next ``acquire``."""
        released = self._held - keys
        self._held = frozenset(keys)
        for key in released:
            entry = self._entries.get(key)
            if entry is not None and entry.users <= 0:
                del self._entries[key]
                entry.client.close_soon()
        for key in keys:
            entry = self._entries.get(key)
            if (entry is None or entry.client.closed) and key not in self._dialing:
                spawn(self._warm(key, timeout), self._warming, f"dialling {key.address}", log)

    async def _warm(self, key: PoolKey, timeout: float) -> None:
        try:
            await self._dial(key, timeout)
        except Exception as e:  # unreachable now: the next acquire tries again
            log.info("storage %s not reachable ahead of use: %s", key.address, e)

    def discard(self, key: PoolKey, client: StorageClient, reason: str) -> None:
        """``client`` failed at the connection level: close it (every session on it
        ends) so that the next acquire dials afresh."""
        entry = self._entries.get(key)
        if entry is not None and entry.client is client:
            del self._entries[key]
        if not client.closed:
            log.info("closing the shared connection to storage %s: %s", key.address, reason)
        client.close_soon()

    def discard_client(self, client: StorageClient, reason: str) -> None:
        """``discard`` for a connection known by itself: its entry, if it has one, goes;
        it is closed either way."""
        for key, entry in list(self._entries.items()):
            if entry.client is client:
                self.discard(key, client, reason)
                return
        client.close_soon()

    async def close(self) -> None:
        self._closed = True
        for task in self._warming:
            task.cancel()
        entries, self._entries = self._entries, {}
        for entry in entries.values():
            with contextlib.suppress(Exception):
                await entry.client.close()


async def _connect(key: PoolKey, timeout: float, open_connection: OpenConnection) -> StorageClient:
    host, _, port = key.address.rpartition(":")
    client = await StorageClient.connect(
        host, int(port), timeout=timeout, open_connection=open_connection, corked=True
    )
    try:
        await wait_for(client.open(key.cluster_key, key.num_partitions), timeout)
    except BaseException:
        await client.close()
        raise
    return client
