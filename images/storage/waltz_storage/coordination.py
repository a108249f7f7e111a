"""Following the cluster's metadata in ZooKeeper: which partitions this storage node holds.

The decisions are pure (``partitions_of``, ``plan_change``, ``count_to_follow``,
``replica_safety.still_needed``); ``ClusterFollower`` is the thin shell: kazoo runs
in its own thread and hands each new replica assignment, each new version of the
cluster's parameters (the partition count grows) and each change of a retiring
partition's metadata to the event loop with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
import uuid
from collections.abc import Callable
from typing import TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import WatchedEvent

from waltz_client.cluster.admin import read_params
from waltz_client.cluster.errors import ClusterError
from waltz_client.cluster.metadata import (
    NO_SESSION,
    ClusterParams,
    MetadataError,
    PartitionMetadata,
    ReplicaAssignment,
    key_fingerprint,
)
from waltz_client.cluster.paths import ClusterPaths
from waltz_client.cluster.replica_safety import still_needed
from waltz_client.cluster.zk import close, connect
from waltz_client.runtime.tls import TlsFiles

log = logging.getLogger(__name__)

T = TypeVar("T")

# How long a new session's first request may wait for ZooKeeper to confirm it.
SESSION_CHECK_TIMEOUT = 10.0


def partitions_of(assignment: ReplicaAssignment, address: str) -> set[int]:
    return set(assignment.storages.get(address, frozenset()))


def plan_change(
    current: set[int], assigned: set[int], retiring: set[int] = frozenset()
) -> tuple[list[int], list[int]]:
    """(partitions to open, partitions to close), in ID order. ``retiring``: partitions no
    longer assigned here that stay (or, after a restart, are again) open while their next
    recovery needs this node's vote."""
    return sorted((assigned | retiring) - current), sorted(current - assigned - retiring)


def count_to_follow(held: int, key: uuid.UUID, params: ClusterParams) -> int:
    """The partition count this node should have once it follows ``params``: the
    cluster's, when it is at least ``held`` (the control file's). ClusterError when the
    parameters are another cluster's (a different key) or have fewer partitions than
    ``held`` (partitions never shrink): then the node keeps what it has."""
    if params.key != key:
        raise ClusterError(
            f"the cluster's key is now {key_fingerprint(params.key)}, this node's is "
            f"{key_fingerprint(key)}: not following its partition count"
        )
    if params.num_partitions < held:
        raise ClusterError(
            f"the cluster has {params.num_partitions} partitions, fewer than the {held} of "
            f"this node's control file (partitions never shrink): keeping {held}"
        )
    return params.num_partitions


def default_advertised_address(host: str, port: int) -> str:
    """The address the cluster knows this node by: the listen host, or the host name when
    listening on every interface."""
    if host in ("", "0.0.0.0", "::"):
        host = socket.gethostname()
    return f"{host}:{port}"


class ClusterFollower:
    def __init__(self, connect_string: str, root: str, tls: TlsFiles | None = None) -> None:
        self.connect_string = connect_string
        self.tls = tls  # reach ZooKeeper's TLS port
        self.paths = ClusterPaths.of(root)
        self._zk: KazooClient | None = None
        self._watched: set[int] = set()  # retiring partitions whose metadata is watched
        # Called (on kazoo's thread) with a partition whose metadata changed after
        # ``recorded_session`` read it: a refusal remembered from that read is stale.
        self.session_changed: Callable[[int], None] | None = None
        self._partition_paths: dict[str, int] = {}

    async def connect(self, retry_every: float = 2.0) -> None:
        """Connect, retrying (with a log line) until ZooKeeper answers."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                self._zk = await loop.run_in_executor(
                    None, lambda: connect(self.connect_string, timeout=10.0, tls=self.tls)
                )
                return
            except ClusterError as e:
                log.warning("%s; retrying in %g s", e, retry_every)
                await asyncio.sleep(retry_every)

    async def wait_for_cluster(self, poll: float = 1.0) -> ClusterParams:
        """The cluster's parameters, waiting until CreateCluster has written them."""
        assert self._zk is not None
        loop = asyncio.get_running_loop()
        warned = False
        while True:
            try:
                return await loop.run_in_executor(None, read_params, self._zk, self.paths.root)
            except ClusterError as e:
                if "no Waltz cluster" not in str(e):
                    raise
                if not warned:
                    log.warning("%s; waiting for it", e)
                    warned = True
                await asyncio.sleep(poll)

    async def current_params(self) -> ClusterParams:
        """The cluster's parameters as ZooKeeper has them now. Read on the session that
        watches: it sees at least everything its watches have reported (ZooKeeper orders a
        session's reads and notifications), so after an assignment that names a new
        partition, the count written with it."""
        zk = self._zk
        if zk is None:
            raise ClusterError("not connected to ZooKeeper")
        return await asyncio.get_running_loop().run_in_executor(
            None, read_params, zk, self.paths.root
        )

    def watch_params(self, on_change: Callable[[ClusterParams], None]) -> None:
        """Call ``on_change`` on the event loop with every version of the cluster's
        parameters (its partition count grows: ``waltz cluster add-partitions``)."""
        self._watch(self.paths.cluster, ClusterParams.decode, on_change, "partition count")

    def watch_assignment(self, on_change: Callable[[ReplicaAssignment], None]) -> None:
        """Call ``on_change`` on the event loop with every version of the replica assignment."""
        self._watch(self.paths.assignment, ReplicaAssignment.decode, on_change, "partitions")

    def _watch(
        self,
        path: str,
        decode: Callable[[bytes], T],
        on_change: Callable[[T], None],
        kept: str,
    ) -> None:
        """Each version of ``path``, decoded, to ``on_change`` on the event loop; a deleted
        or unreadable version is logged and the current ``kept`` stays."""
        assert self._zk is not None
        loop = asyncio.get_running_loop()

        def watcher(data: bytes | None, _stat: object) -> None:  # kazoo's thread
            if data is None:
                log.error("%s was deleted; keeping the current %s", path, kept)
                return
            try:
                value = decode(data)
            except MetadataError as e:
                log.error("%s: %s; keeping the current %s", path, e, kept)
                return
            loop.call_soon_threadsafe(on_change, value)

        try:
            self._zk.DataWatch(path, watcher)
        except NoNodeError:  # pragma: no cover - DataWatch tolerates a missing node
            log.error("%s does not exist", path)

    async def needing_vote(self, partitions: set[int], address: str) -> set[int]:
        """Of ``partitions``, those whose next recovery needs ``address``'s vote (it is a
        member of their last writing session). A partition whose metadata does not decode
        is kept: when in doubt, keep serving."""
        assert self._zk is not None
        zk = self._zk

        def read() -> set[int]:
            needed = set()
            for p in sorted(partitions):
                path = self.paths.partition(p)
                try:
                    data, _ = zk.get(path)
                    metadata = PartitionMetadata.decode(data)
                except NoNodeError:
                    continue
                except MetadataError as e:
                    log.error("%s: %s; keeping partition %d open", path, e, p)
                    needed.add(p)
                    continue
                if still_needed(metadata, address):
                    needed.add(p)
            return needed

        return await asyncio.get_running_loop().run_in_executor(None, read)

    def recorded_session(self, partition_id: int) -> int:
        """The newest store session the partition's metadata records (NO_SESSION if none).

        Blocking, for a worker thread. A ``sync`` first: this node's ZooKeeper member
        may lag behind the one the server just wrote the session to. With
        ``session_changed`` set, the read leaves a watch that calls it on the next change."""
        metadata = self._partition_metadata(partition_id, watch=self.session_changed is not None)
        return NO_SESSION if metadata is None else metadata.session_id

    def recorded_sessions(self, partition_ids: list[int]) -> dict[int, int]:
        """``recorded_session`` of several partitions in one pipelined round trip: one
        sync, then every read, all sent before any answer is awaited (ZooKeeper answers a
        session's requests in order, so the reads follow the sync). Blocking. A
        partition whose read failed is left out (its request then asks on its own)."""
        zk = self._zk
        if zk is None:
            raise ClusterError("not connected to ZooKeeper")
        watcher = self._metadata_event if self.session_changed is not None else None
        # One sync for them all: it brings this session's ZooKeeper member up to the
        # leader, whatever its path, and the reads after it see at least that state.
        synced = zk.sync_async(self.paths.partition(partition_ids[0])) if partition_ids else None
        asked = []
        for partition_id in partition_ids:
            path = self.paths.partition(partition_id)
            if watcher is not None:
                self._partition_paths[path] = partition_id
            asked.append((partition_id, zk.get_async(path, watch=watcher)))
        recorded: dict[int, int] = {}
        # One deadline for them all: a ZooKeeper that does not answer costs the group one
        # timeout here, not one a partition (its requests then ask on their own).
        deadline = time.monotonic() + SESSION_CHECK_TIMEOUT
        try:
            if synced is not None:
                synced.get(timeout=SESSION_CHECK_TIMEOUT)
        except Exception as e:  # unsynced, a read may lag: each request asks on its own
            log.debug("syncing before reading %d sessions failed: %s", len(partition_ids), e)
            return {}
        for partition_id, read in asked:
            try:
                data, _ = read.get(timeout=max(0.0, deadline - time.monotonic()))
            except NoNodeError:
                recorded[partition_id] = NO_SESSION
            except Exception as e:  # that partition's request asks again on its own
                log.debug("partition %d: reading its session failed: %s", partition_id, e)
            else:
                recorded[partition_id] = PartitionMetadata.decode(data).session_id
        return recorded

    def recorded_log_start(self, partition_id: int) -> int:
        """The log start the partition's metadata records (0 if none); as above."""
        metadata = self._partition_metadata(partition_id)
        return 0 if metadata is None else metadata.log_start

    def _partition_metadata(
        self, partition_id: int, watch: bool = False
    ) -> PartitionMetadata | None:
        zk = self._zk
        if zk is None:
            raise ClusterError("not connected to ZooKeeper")
        path = self.paths.partition(partition_id)
        if watch:
            self._partition_paths[path] = partition_id
        try:
            zk.sync_async(path).get(timeout=SESSION_CHECK_TIMEOUT)
            # kazoo keeps one watcher per function and path, however often it is read.
            watcher = self._metadata_event if watch else None
            data, _ = zk.get_async(path, watch=watcher).get(timeout=SESSION_CHECK_TIMEOUT)
        except NoNodeError:
            return None
        return PartitionMetadata.decode(data)

    def _metadata_event(self, event: WatchedEvent) -> None:  # kazoo's thread
        partition_id = self._partition_paths.get(event.path)
        listener = self.session_changed
        if partition_id is not None and listener is not None:
            listener(partition_id)

    def watch_partition(self, partition_id: int, on_change: Callable[[], None]) -> None:
        """Call ``on_change`` on the event loop whenever the partition's metadata changes,
        until ``unwatch_partition``."""
        assert self._zk is not None
        loop = asyncio.get_running_loop()
        if partition_id in self._watched:
            return
        self._watched.add(partition_id)

        def watcher(_data: bytes | None, _stat: object) -> bool:  # kazoo's thread
            if partition_id not in self._watched:
                return False  # unregisters the watch
            loop.call_soon_threadsafe(on_change)
            return True

        self._zk.DataWatch(self.paths.partition(partition_id), watcher)

    def unwatch_partition(self, partition_id: int) -> None:
        self._watched.discard(partition_id)

    async def close(self) -> None:
        if self._zk is not None:
            zk, self._zk = self._zk, None
            await asyncio.get_running_loop().run_in_executor(None, close, zk)
