"""Following the cluster's metadata in ZooKeeper: which partitions this storage node holds.

The decisions are pure (``partitions_of``, ``plan_change``); ``ClusterFollower``
is the thin shell: kazoo runs in its own thread and hands each new replica
assignment to the event loop with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from waltz_client.cluster.admin import read_params
from waltz_client.cluster.metadata import ClusterParams, MetadataError, ReplicaAssignment
from waltz_client.cluster.paths import ClusterPaths
from waltz_client.cluster.zk import ClusterError, close, connect

log = logging.getLogger(__name__)


def partitions_of(assignment: ReplicaAssignment, address: str) -> set[int]:
    return set(assignment.storages.get(address, frozenset()))


def plan_change(current: set[int], desired: set[int]) -> tuple[list[int], list[int]]:
    """(partitions to open, partitions to close), in ID order."""
    return sorted(desired - current), sorted(current - desired)


def default_advertised_address(host: str, port: int) -> str:
    """The address the cluster knows this node by: the listen host, or the host name when
    listening on every interface."""
    if host in ("", "0.0.0.0", "::"):
        host = socket.gethostname()
    return f"{host}:{port}"


class ClusterFollower:
    def __init__(self, connect_string: str, root: str) -> None:
        self.connect_string = connect_string
        self.paths = ClusterPaths.of(root)
        self._zk: KazooClient | None = None

    async def connect(self, retry_every: float = 2.0) -> None:
        """Connect, retrying (with a log line) until ZooKeeper answers."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                self._zk = await loop.run_in_executor(
                    None, lambda: connect(self.connect_string, timeout=10.0)
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

    def watch_assignment(self, on_change: Callable[[ReplicaAssignment], None]) -> None:
        """Call ``on_change`` on the event loop with every version of the replica assignment."""
        assert self._zk is not None
        loop = asyncio.get_running_loop()
        path = self.paths.assignment

        def watcher(data: bytes | None, _stat: object) -> None:  # kazoo's thread
            if data is None:
                log.error("%s was deleted; keeping the current partitions", path)
                return
            try:
                assignment = ReplicaAssignment.decode(data)
            except MetadataError as e:
                log.error("%s: %s; keeping the current partitions", path, e)
                return
            loop.call_soon_threadsafe(on_change, assignment)

        try:
            self._zk.DataWatch(path, watcher)
        except NoNodeError:  # pragma: no cover - DataWatch tolerates a missing node
            log.error("%s does not exist", path)

    async def close(self) -> None:
        if self._zk is not None:
            zk, self._zk = self._zk, None
            await asyncio.get_running_loop().run_in_executor(None, close, zk)
