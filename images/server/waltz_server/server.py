"""The server daemon's state: the partitions it owns, its client listener, its coordinator.

Ownership from ZooKeeper decides which partitions run here: a partition
that appears (or comes back with a new generation) is started, one that
leaves is stopped and its feeds suspended. Losing the ZooKeeper session
stops them all at once. A change in a partition's replica set ends its store
session at a planned boundary, so that its next session covers the new replicas.
"""

from __future__ import annotations

import asyncio
import logging

from waltz_client.cluster.access import DENY_ALL, AccessPolicy
from waltz_client.cluster.metadata import ReplicaAssignment
from waltz_client.runtime.listener import listen
from waltz_client.runtime.peer_limits import PeerGuard, peer_limits_of
from waltz_client.runtime.tasks import spawn
from waltz_client.runtime.tls import TlsContexts, tls_open_connection
from waltz_client.wire.storage_client import answers_handshake

from .catch_up import CatchUpSettings
from .client_identity import ClientBindings
from .config import ServerConfig
from .connection import ClientConnectionHandler, ConnectionLimits
from .coordinator import ServerCoordinator
from .memory_budget import PartitionBounds, partition_bounds
from .metrics import ServerMetrics
from .partition import Partition, PartitionSettings
from .recovery_manager import RecoveryContext
from .storage_pool import PoolKey, StoragePool
from .storage_replacer import ReplacementView, StorageReplacer

log = logging.getLogger(__name__)


class WaltzServer:
    def __init__(self, config: ServerConfig, coordinator: ServerCoordinator) -> None:
        self.config = config
        self.coordinator = coordinator
        self.partitions: dict[int, Partition] = {}
        self.connection_limits = ConnectionLimits(
            max_feeds=config.max_feeds_per_connection,
            max_reads=config.max_reads_per_connection,
            max_read_bytes=config.max_read_bytes_per_connection,
            peer=peer_limits_of(config),
        )
        # Ready: the hello and a first request done (a Mount, or a read).
        self.guard = PeerGuard(self.connection_limits.peer, "first request", config.max_frame_bytes)
        # Client IDs: allocated here; with client certificates, each belongs to one identity.
        self.bindings = ClientBindings(
            lambda: coordinator._zk if coordinator.connected else None,
            config.zk_root,
            quota=config.client_id_quota,
            retention=config.client_id_retention,
        )
        self._client_ids: asyncio.Task | None = None
        self.metrics = ServerMetrics(self)
        self.partition_settings = PartitionSettings(
            lock_table_size=config.lock_table_size,
            lock_hashes=config.lock_hashes,
            feed_cache_bytes=config.feed_cache_bytes,
            data_cache_bytes=config.data_cache_bytes,
            max_queue=config.max_queue,
            checkpoint_interval=config.checkpoint_interval,
            max_feeds=config.max_feeds_per_partition,
            retention_interval=config.retention_interval,
        )
        self.bounds: PartitionBounds = partition_bounds(
            config.memory_budget_bytes,
            0,
            feed_cache_bytes=config.feed_cache_bytes,
            data_cache_bytes=config.data_cache_bytes,
            backlog_bytes=config.max_batch_bytes * config.max_in_flight,
        )
        self._owned: dict[int, int] = {}
        self._changes: asyncio.Queue[None] = asyncio.Queue()
        self._listener: asyncio.Server | None = None
        self._reconciler: asyncio.Task | None = None
        self._stopping: set[asyncio.Task[None]] = set()  # partitions being stopped
        # How partitions reach storage nodes: over TLS when storage_tls_* are set.
        self._storage_dialer = (
            {
                "open_connection": tls_open_connection(
                    TlsContexts(config.storage_tls, listening=False)
                )
            }
            if config.storage_tls.enabled
            else {}
        )
        # One connection a storage node, shared by every partition's store session.
        self.storage_pool = StoragePool(**self._storage_dialer)
        # And one a storage node for recoveries, apart from the appends' (storage_pool.py).
        self.recovery_pool = StoragePool(**self._storage_dialer)
        # Opt-in: the assigner replaces storage nodes that stay unreachable.
        self.replacer = (
            StorageReplacer(coordinator, config.replace_storage_after, self._storage_answers)
            if config.replace_storage_after > 0
            else None
        )
        self._replacing: asyncio.Task | None = None

    @property
    def replacement_view(self) -> ReplacementView | None:
        return self.replacer.view if self.replacer is not None else None

    async def _storage_answers(self, address: str, timeout: float) -> bool:
        return await answers_handshake(address, timeout, **self._storage_dialer)

    # --- listening ----------------------------------------------------------------------

    @property
    def connections(self) -> set[ClientConnectionHandler]:
        """Open client connections (the guard admits and forgets them)."""
        return self.guard.connections  # type: ignore[return-value]

    async def listen(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        tls = self.config.tls
        # Each connection counts from accept, before its TLS handshake (runtime/listener.py).
        context = TlsContexts(tls, listening=True).listening_context() if tls.enabled else None
        self._listener = await listen(
            self._new_connection,
            host,
            port,
            ssl_context=context,
            handshake_timeout=self.connection_limits.peer.handshake_timeout,
        )
        self._reconciler = loop.create_task(self._reconcile_loop())
        self._client_ids = loop.create_task(
            self.bindings.maintain(self._client_ids_in_use, self._sweeps_client_ids)
        )
        if self.replacer is not None:
            self._replacing = loop.create_task(self.replacer.run())
        self.guard.start()
        return self._listener.sockets[0].getsockname()[1]

    def _new_connection(self) -> ClientConnectionHandler:
        conn = ClientConnectionHandler(
            self.partitions.get,
            self.config.max_frame_bytes,
            self.config.max_data_bytes,
            self._connection_closed,
            lambda kind: self.metrics.client_errors.labels(kind).inc(),
            self.config.client_write_buffer_bytes,
            self.guard,
            self.connection_limits,
            self.bindings,
            lambda: self.access_policy,
        )
        self.metrics.connections.inc()
        return conn

    def _connection_closed(self, conn: ClientConnectionHandler) -> None:
        for p in conn.partitions_touched:
            partition = self.partitions.get(p)
            if partition is not None:
                partition.disconnect(conn)

    # --- readiness ----------------------------------------------------------------------

    @property
    def access_policy(self) -> AccessPolicy | None:
        """The cluster's access policy, or None until this server has read it once. The
        client port opens before ZooKeeper is reached (its registration names the bound
        port); meanwhile the coordinator holds DENY_ALL, and requests are told to retry
        (NOT_READY) rather than refused (FORBIDDEN) on a policy nobody wrote."""
        policy = self.coordinator.access
        return None if policy is DENY_ALL else policy

    @property
    def ready(self) -> bool:
        """Registered in ZooKeeper, and the access policy read: requests get answers."""
        return self.coordinator.connected and self.access_policy is not None

    async def ready_connections(self, assignment: ReplicaAssignment) -> None:
        """Before registering: a connection open to every storage node, for appends and
        for recoveries, so that the partitions the assigner gives this server as soon as
        it registers start without handshakes."""
        params = self.coordinator.params
        if params is None or not self.config.shared_storage_connections:
            return
        nodes = {PoolKey(a, params.key, params.num_partitions) for a in assignment.storages}
        # A node down now must not hold the registration up for long.
        timeout, wait = self.config.storage_timeout, min(self.config.storage_timeout, 2.0)
        await asyncio.gather(
            self.storage_pool.warm(nodes, timeout, wait),
            self.recovery_pool.warm(nodes, timeout, wait),
        )

    # --- ownership ----------------------------------------------------------------------

    def ownership_changed(self, owned: dict[int, int]) -> None:
        self._owned = dict(owned)
        self._changes.put_nowait(None)

    def assignment_changed(self, assignment: ReplicaAssignment) -> None:
        self._changes.put_nowait(None)

    def session_lost(self) -> None:
        """Stop serving at once; ownership is re-read when a new session starts."""
        self._owned = {}
        for partition in list(self.partitions.values()):
            self._stop_soon(partition, "ZooKeeper session lost")
        self.partitions.clear()

    def superseded(self, partition: Partition, reason: str) -> None:
        """``partition`` found a newer generation: stop it, unless it was replaced already
        (a newer object for the same partition is not the one superseded)."""
        partition_id = partition.partition_id
        if self.partitions.get(partition_id) is partition:
            self.partitions.pop(partition_id, None)
            self._apply_memory_budget()
            self._stop_soon(partition, reason)

    def _stop_soon(self, partition: Partition, reason: str) -> asyncio.Task[None]:
        """Stop ``partition`` (taken off ``partitions`` by the caller) in a task of its
        own, counted as stopping at once. Counted only once its task ran, a planned stop
        saw no partition left in the turn between, closed the server under partitions
        still serving, and their store sessions, ended by the closed connections, started
        recoveries that raced the new owners'."""
        return spawn(
            self._stop(partition, reason),
            self._stopping,
            f"stopping partition {partition.partition_id}",
            log,
        )

    async def _stop(self, partition: Partition, reason: str) -> None:
        log.info("partition %d: stopping: %s", partition.partition_id, reason)
        await partition.stop(reason)

    @property
    def holds_partitions(self) -> bool:
        """Whether any partition is served here or still stopping."""
        return bool(self.partitions) or bool(self._stopping)

    async def _reconcile_loop(self) -> None:
        while True:
            await self._changes.get()
            while not self._changes.empty():
                self._changes.get_nowait()
            try:
                await self._reconcile()
            except Exception:
                log.exception("applying an ownership change failed")

    async def _reconcile(self) -> None:
        assignment = self.coordinator.assignment
        params = self.coordinator.params
        if assignment is None or params is None:
            return
        if self.config.shared_storage_connections:
            # Open ahead, to every storage node: the partitions this server may be given.
            nodes = {PoolKey(a, params.key, params.num_partitions) for a in assignment.storages}
            for pool in (self.storage_pool, self.recovery_pool):
                pool.hold(nodes, self.config.storage_timeout)
        stopping: list[tuple[Partition, str]] = []
        for p, partition in list(self.partitions.items()):
            want = self._owned.get(p)
            replicas = tuple(assignment.replicas_of(p))
            if want == partition.generation and replicas and replicas != partition.context.replicas:
                # Same owner, new replica set: a planned session boundary, not a restart
                # (feeds and mounts stay; in-flight appends commit first).
                log.info("partition %d: replicas changed to %s", p, ", ".join(replicas))
                partition.change_replicas(replicas)
            elif want != partition.generation or not replicas:
                self.partitions.pop(p)
                why = (
                    "moved to another server"
                    if want is None
                    else f"generation {want}"
                    if want != partition.generation
                    else "no replicas assigned"
                )
                stopping.append((partition, why))
        # All at once: each waits for its tasks and its store session to end, and a
        # server giving half its partitions to a newcomer would otherwise take that long
        # once per partition.
        await asyncio.gather(*(self._stop_soon(partition, why) for partition, why in stopping))
        self._apply_memory_budget()
        for p, generation in sorted(self._owned.items()):
            if p in self.partitions:
                continue
            replicas = tuple(assignment.replicas_of(p))
            if not replicas:
                log.warning("partition %d has no replicas assigned; not serving it", p)
                continue
            context = RecoveryContext(
                partition_id=p,
                generation=generation,
                replicas=replicas,
                cluster_key=params.key,
                num_partitions=params.num_partitions,
                metadata=self.coordinator,
                connect_timeout=self.config.storage_timeout,
                max_batch_bytes=self.config.max_batch_bytes,
                max_in_flight=self.config.max_in_flight,
                max_member_backlog_bytes=self.config.max_member_backlog_bytes,
                catch_up=CatchUpSettings(
                    inline_records=self.config.catch_up_inline_records,
                    rate=self.config.catch_up_rate,
                ),
                pool=self.storage_pool if self.config.shared_storage_connections else None,
                recovery_pool=self.recovery_pool
                if self.config.shared_storage_connections
                else None,
                **self._storage_dialer,
            )
            partition = Partition(
                context,
                self.partition_settings,
                self.superseded,
                self.metrics.commit_seconds.labels(str(p)).observe,
                lambda: self.coordinator.retention,
            )
            self.partitions[p] = partition
            self._apply_memory_budget()
            partition.start()
            log.info(
                "partition %d: serving with generation %d, replicas %s",
                p,
                generation,
                ", ".join(replicas),
            )

    def _apply_memory_budget(self) -> None:
        """Size every owned partition's caches so that together they stay within
        ``memory_budget_bytes`` (``memory_budget``)."""
        s = self.partition_settings
        self.bounds = partition_bounds(
            self.config.memory_budget_bytes,
            len(self.partitions),
            feed_cache_bytes=s.feed_cache_bytes,
            data_cache_bytes=s.data_cache_bytes,
            backlog_bytes=self.config.max_batch_bytes * self.config.max_in_flight,
        )
        for partition in self.partitions.values():
            partition.feed_cache.resize(self.bounds.feed_cache_bytes)
            partition.data_cache.resize(self.bounds.data_cache_bytes)

    def _client_ids_in_use(self) -> set[tuple[int, str]]:
        """(client ID, identity) of every ID a connection with a certificate uses."""
        return {
            (client_id, c.identity)
            for c in self.connections
            if c.identity is not None
            for client_id in c.client_ids_in_use
        }

    def _sweeps_client_ids(self) -> bool:
        """One server releases unused client IDs: the assigner (the lowest live ID)."""
        return self.coordinator.is_assigner

    async def close(self) -> None:
        if self._reconciler is not None:
            self._reconciler.cancel()
        if self._client_ids is not None:
            self._client_ids.cancel()
        if self._replacing is not None:
            self._replacing.cancel()
        await self.guard.stop()
        if self._listener is not None:
            self._listener.close()
        await asyncio.gather(*(p.stop("server shutting down") for p in self.partitions.values()))
        self.partitions.clear()
        await self.storage_pool.close()
        await self.recovery_pool.close()
        for conn in list(self.connections):
            conn.close()
