"""``waltz-storage``: run a storage node until SIGTERM or Ctrl-C."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import uuid

from waltz_client.cluster.errors import ClusterError
from waltz_client.cluster.metadata import ClusterParams, ReplicaAssignment, key_fingerprint
from waltz_client.cluster.partition_ranges import format_partition_ranges
from waltz_client.runtime.daemon import HttpThread, run_daemon, settle_heap, write_ready_file
from waltz_client.runtime.peer_limits import peer_limits_of
from waltz_client.runtime.tls import TlsContexts, warn_plaintext
from waltz_client.wire.native import describe as describe_loops

from .config import ConfigError, StorageConfig, load_config
from .coordination import (
    ClusterFollower,
    count_to_follow,
    default_advertised_address,
    partitions_of,
    plan_change,
)
from .errors import ControlFileError
from .http import build_app
from .segment_format import disk_bytes_bound
from .server import ServerSettings, StorageServer
from .service import EngineSettings, StorageNode

log = logging.getLogger("waltz_storage")


def _error(message: str) -> int:
    print(f"waltz-storage: error: {message}", file=sys.stderr)
    return 2


class _StartFailed(Exception):
    """The node cannot start; the message says why (what it opened is closed again)."""


async def serve(config: StorageConfig) -> int:
    server_settings = _server_settings(config)
    engine_settings = _engine_settings(config)
    stop = _stop_on_signals()
    try:
        follower, key, num_partitions = await _read_cluster(config)
        node = await _open_node(config, engine_settings, follower, key, num_partitions)
        server = StorageServer(node, server_settings)
        # Probes and scrapes on a thread of their own: small write groups run on this
        # loop's thread, and a slow fsync must not make /healthz miss its deadline.
        http = HttpThread()
        port, http_port = await _listen(config, server, http, node, follower)
    except _StartFailed as e:
        return _error(str(e))
    advertised = ""
    if follower is not None:
        advertised = await _follow_assignment(config, node, server, follower, port)
    _log_serving(config, node, key, port, http_port)
    settle_heap()
    if config.ready_file:
        write_ready_file(
            config.ready_file,
            {
                "pid": os.getpid(),
                "port": port,
                "http_port": http_port,
                "advertised_address": advertised,
            },
        )
    await stop.wait()
    log.info("stopping")
    if follower is not None:
        await follower.close()
    await http.stop()
    await server.close()
    node.close()
    return 0


def _server_settings(config: StorageConfig) -> ServerSettings:
    return ServerSettings(
        max_frame_bytes=config.max_frame_bytes,
        queue_max_requests=config.queue_max_requests,
        queue_max_bytes=config.queue_max_bytes,
        node_queue_max_bytes=config.node_queue_max_bytes,
        write_group_max_bytes=config.write_group_max_bytes,
        inline_group_max_seconds=config.inline_group_max_ms / 1000,
        tls=TlsContexts(config.tls, listening=True) if config.tls.enabled else None,
        allowed_peers=config.tls_allowed_peers,
        peer=peer_limits_of(config),
    )


def _engine_settings(config: StorageConfig) -> EngineSettings:
    return EngineSettings(
        segment_bytes=config.segment_bytes,
        # The most bytes one write group can leave unsynced: a drained batch stops
        # once it reaches write_group_max_bytes, so at most one more frame; records
        # take at most 48/36 of their wire size on disk (an older server's, format 1).
        max_torn_bytes=disk_bytes_bound(config.write_group_max_bytes + config.max_frame_bytes) + 1,
        group_sync=config.group_sync,
        group_sync_write_back=config.group_sync_write_back,
    )


def _stop_on_signals() -> asyncio.Event:
    """An event SIGINT and SIGTERM set."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def _read_cluster(config: StorageConfig) -> tuple[ClusterFollower | None, uuid.UUID, int]:
    """The cluster key and partition count: from the settings, or from ZooKeeper through
    the returned follower once the cluster exists there."""
    follower: ClusterFollower | None = None
    key, num_partitions = config.cluster_key, config.num_partitions
    if config.zookeeper:
        follower = ClusterFollower(config.zookeeper, config.zk_root, tls=config.zk_tls)
        log.info("reading cluster %s from ZooKeeper %s", config.zk_root, config.zookeeper)
        await follower.connect()
        params = await follower.wait_for_cluster()
        if key is not None and key != params.key:
            await follower.close()
            raise _StartFailed(
                f"setting cluster_key ({key_fingerprint(key)}) differs from the key of the "
                f"cluster at {config.zk_root} ({key_fingerprint(params.key)})"
            )
        key, num_partitions = params.key, params.num_partitions
    assert key is not None and num_partitions is not None
    return follower, key, num_partitions


async def _open_node(
    config: StorageConfig,
    engine_settings: EngineSettings,
    follower: ClusterFollower | None,
    key: uuid.UUID,
    num_partitions: int,
) -> StorageNode:
    """The storage directory opened; its sessions checked against ZooKeeper's if followed."""
    loop = asyncio.get_running_loop()
    try:
        node = await loop.run_in_executor(
            None,
            lambda: StorageNode.open(
                config.directory, key, num_partitions, set(config.partitions or ()), engine_settings
            ),
        )
    except ControlFileError as e:
        if follower:
            await follower.close()
        raise _StartFailed(str(e)) from None
    except OSError as e:
        if follower:
            await follower.close()
        raise _StartFailed(
            f"setting directory ({config.directory}): cannot use it as the storage "
            f"directory: {e.strerror or e}"
        ) from None
    if follower is not None:
        node.verify_sessions_with(
            follower.recorded_session, follower.recorded_log_start, follower.recorded_sessions
        )
        assert node.session_checks is not None
        follower.session_changed = node.session_checks.forget
    return node


async def _listen(
    config: StorageConfig,
    server: StorageServer,
    http: HttpThread,
    node: StorageNode,
    follower: ClusterFollower | None,
) -> tuple[int, int]:
    """The storage port and the HTTP port, listening."""
    try:
        port = await server.start(config.host, config.port)
        http_port = await http.start(
            build_app(server),
            config.host,
            config.http_port,
            config.tls if config.http_tls else None,
        )
    except OSError as e:
        await http.stop()
        await server.close()
        node.close()
        if follower:
            await follower.close()
        raise _StartFailed(f"cannot listen on {config.host}: {e.strerror}") from None
    if not config.tls.enabled:
        warn_plaintext("storage node", config.host, port, log)
    return port, http_port


async def _follow_assignment(
    config: StorageConfig,
    node: StorageNode,
    server: StorageServer,
    follower: ClusterFollower,
    port: int,
) -> str:
    """Open the partitions the replica assignment gives this node, and keep following it
    and the cluster's partition count; the address this node is known by there."""
    advertised = config.advertised_address or default_advertised_address(config.host, port)
    first_assignment = asyncio.Event()
    apply = AssignmentApplier(node, server, advertised, follower)
    follower.watch_params(apply.cluster_changed)
    follower.watch_assignment(lambda a: apply.submit(a, first_assignment))
    await first_assignment.wait()
    return advertised


def _log_serving(
    config: StorageConfig, node: StorageNode, key: uuid.UUID, port: int, http_port: int
) -> None:
    log.info(
        "storage node serving partitions %s of cluster %s on %s:%d (http %d), dir %s, "
        "per-record loops %s",
        format_partition_ranges(set(node.partitions)) or "none",
        key_fingerprint(key),  # the key itself is a secret: never logged
        config.host,
        port,
        http_port,
        config.directory,
        describe_loops(),
    )


class AssignmentApplier:
    """Opens and closes partitions as the replica assignment changes, and grows the
    control file as the cluster's partition count grows, one change at a time.

    A partition no longer assigned here stays open while it is a member of the
    partition's last writing session: the next recovery counts its vote (removing it at
    once could leave that vote undecidable). The partition's metadata is watched and the
    partition closed once a newer session no longer lists it as a member.

    The count and the assignment change in one ZooKeeper transaction, but their watches
    report in either order: an assignment naming a partition beyond the node's count
    makes it read the count and grow before it opens that partition."""

    def __init__(
        self, node: StorageNode, server: StorageServer, address: str, follower: ClusterFollower
    ) -> None:
        self._node = node
        self._server = server
        self._address = address
        self._follower = follower
        self._latest: ReplicaAssignment | None = None
        self._current: ReplicaAssignment | None = None
        self._retiring: set[int] = set()
        self._started = False  # the first assignment after start looks at the disk too
        self._task: asyncio.Task | None = None
        self._applied: list[asyncio.Event] = []
        self._wanted_count = node.num_partitions  # the highest count the cluster reported

    def submit(self, assignment: ReplicaAssignment, applied: asyncio.Event | None = None) -> None:
        self._latest = assignment
        if applied is not None:
            self._applied.append(applied)
        self._run()

    def cluster_changed(self, params: ClusterParams) -> None:
        """A new version of the cluster's parameters: grow to its partition count."""
        if self._follow_count(params):
            self._run()

    def _follow_count(self, params: ClusterParams) -> bool:
        """Note the count ``params`` give; True if the node has to grow to it."""
        try:
            count = count_to_follow(self._node.num_partitions, self._node.cluster_key, params)
        except ClusterError as e:
            log.error("%s", e)
            return False
        self._wanted_count = max(self._wanted_count, count)
        return self._wanted_count > self._node.num_partitions

    def _run(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._apply())
            self._task.add_done_callback(_log_failure)

    def _metadata_changed(self) -> None:
        if self._current is not None:
            self.submit(self._latest or self._current)

    async def _apply(self) -> None:
        while self._latest is not None or self._wanted_count > self._node.num_partitions:
            assignment, self._latest = self._latest, None
            if assignment is not None:
                self._current = assignment
            try:
                await self._grow()
                if assignment is not None:
                    await self._apply_one(assignment)
            except Exception as e:  # ZooKeeper unreachable, a disk error: try again
                log.error(
                    "applying the replica assignment or partition count failed: %s; "
                    "retrying in 2 s",
                    e,
                )
                await asyncio.sleep(2.0)
                self._latest = self._latest or assignment
        for event in self._applied:
            event.set()
        self._applied.clear()

    async def _grow(self) -> None:
        """Grow the control file to the highest count the cluster reported (if above it)."""
        if self._wanted_count > self._node.num_partitions:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, self._node.grow, self._wanted_count)

    async def _within_count(self, assigned: set[int]) -> set[int]:
        """``assigned``, once the node has grown to hold them all. One beyond its count:
        the assignment's watch reported before the count's; the count was written in the
        same transaction, so read it now and grow first. Partitions beyond even the
        cluster's count (a broken assignment) are left out, with an error."""
        if all(p < self._node.num_partitions for p in assigned):
            return assigned
        self._follow_count(await self._follower.current_params())
        await self._grow()
        beyond = {p for p in assigned if p >= self._node.num_partitions}
        if beyond:
            log.error(
                "the replica assignment gives this node partitions %s, outside the cluster's "
                "0..%d: not opening them",
                format_partition_ranges(beyond),
                self._node.num_partitions - 1,
            )
        return assigned - beyond

    async def _apply_one(self, assignment: ReplicaAssignment) -> None:
        loop = asyncio.get_running_loop()
        if self._address not in assignment.storages:
            log.warning(
                "%s is not in the cluster's replica assignment (nodes: %s); holding no partitions",
                self._address,
                ", ".join(sorted(assignment.storages)) or "none",
            )
        current = set(self._node.partitions)
        assigned = await self._within_count(partitions_of(assignment, self._address))
        candidates = current - assigned
        if not self._started:
            # After a restart: a partition removed from this node shortly before may still
            # be needed for a vote; its control state says a session used it here.
            candidates |= await loop.run_in_executor(None, self._node.partitions_with_state)
            candidates -= assigned
            self._started = True
        retiring = await self._follower.needing_vote(candidates, self._address)
        to_open, to_close = plan_change(current, assigned, retiring)
        for p in to_open:
            await loop.run_in_executor(None, self._node.add_partition, p)
            self._server.add_partition(p)
        for p in to_close:
            await self._server.remove_partition(p)
            await loop.run_in_executor(None, self._node.remove_partition, p)
            self._follower.unwatch_partition(p)
        for p in sorted(retiring - self._retiring):
            log.info(
                "partition %d is no longer assigned here, but its last writing session "
                "counts this node's vote: serving it until a newer session has recovered",
                p,
            )
            self._follower.watch_partition(p, self._metadata_changed)
        self._retiring = retiring
        if to_open or to_close:
            log.info(
                "replica assignment changed: opened %s, closed %s; holding %s",
                format_partition_ranges(to_open) or "none",
                format_partition_ranges(to_close) or "none",
                format_partition_ranges(set(self._node.partitions)) or "none",
            )


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("applying the replica assignment failed: %s", task.exception())


def main(argv: list[str] | None = None) -> None:
    run_daemon("waltz-storage", lambda: load_config(argv, os.environ), serve, ConfigError)


if __name__ == "__main__":
    main()
