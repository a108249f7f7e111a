"""The client's view of the cluster in ZooKeeper: who owns each partition, and where.

kazoo watches the ownership node and the live servers in its own thread and
hands every change to the event loop; ``owner`` answers from the latest view
and ``changed`` wakes whoever waits for a partition to move.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TypeVarTuple

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import ZnodeStat

from .cluster.admin import new_client_id, read_params
from .cluster.metadata import ClusterParams, MetadataError, Ownership, ServerRegistration
from .cluster.paths import ClusterPaths
from .cluster.zk import close, connect
from .runtime.tasks import spawn, wait_for
from .runtime.tls import TlsFiles

log = logging.getLogger(__name__)

Ts = TypeVarTuple("Ts")


class ClusterView:
    def __init__(
        self,
        connect_string: str,
        root: str,
        session_timeout: float = 10.0,
        tls: TlsFiles | None = None,
        connect_timeout: float = 10.0,
    ) -> None:
        self.connect_string = connect_string
        self.connect_timeout = connect_timeout  # start() waits this long for ZooKeeper
        self.tls = tls  # reach ZooKeeper's TLS port
        self.paths = ClusterPaths.of(root)
        self.session_timeout = session_timeout
        self.params: ClusterParams | None = None
        self.client_id = -1  # given by a server (WaltzClient allocates it on first use)
        self.ownership: dict[int, tuple[str | None, int]] = {}
        self.servers: dict[str, ServerRegistration] = {}
        self._zk: KazooClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed = asyncio.Event()
        # Called on the loop with (old count, new count) when the cluster's partitions grow.
        self.on_grown: Callable[[int, int], None] | None = None
        self._server_loads = 0
        self._tasks: set[asyncio.Task] = set()  # loads of the live servers

    async def start(self) -> None:
        """Connect, read the cluster, and start watching. Raises ClusterError when
        ZooKeeper or the cluster is missing."""
        self._loop = asyncio.get_running_loop()
        run = self._loop.run_in_executor
        self._zk = await run(
            None,
            lambda: connect(
                self.connect_string,
                timeout=self.connect_timeout,
                session_timeout=self.session_timeout,
                tls=self.tls,
            ),
        )
        try:
            self.params = await run(None, read_params, self._zk, self.paths.root)
        except BaseException:
            await self.stop()
            raise
        self._zk.DataWatch(self.paths.cluster, self._cluster_changed)
        self._zk.DataWatch(self.paths.ownership, self._ownership_changed)
        self._zk.ChildrenWatch(self.paths.servers, self._servers_changed)

    async def draw_client_id(self) -> int:
        """A client ID drawn from ZooKeeper's counter by this client itself: only for a
        server older than AllocateClientId (its cluster lets anyone draw)."""
        assert self._zk is not None, "not started"
        return await asyncio.get_running_loop().run_in_executor(
            None, new_client_id, self._zk, self.paths.root
        )

    async def stop(self) -> None:
        if self._zk is not None:
            zk, self._zk = self._zk, None
            await asyncio.get_running_loop().run_in_executor(None, close, zk)

    @property
    def num_partitions(self) -> int:
        assert self.params is not None, "not started"
        return self.params.num_partitions

    def owner(self, partition_id: int) -> tuple[str, int] | None:
        """(host:port, generation) of the partition's live owner, if it has one."""
        server, generation = self.ownership.get(partition_id, (None, 0))
        if server is None or server not in self.servers:
            return None
        return self.servers[server].endpoint, generation

    def tls_name(self, endpoint: str) -> str:
        """The name the server live at ``endpoint`` (host:port) proves with its TLS
        certificate: its registration's ``tls_name``, else the host (also for an endpoint
        no live server holds any more)."""
        for registration in self.servers.values():
            if registration.endpoint == endpoint:
                return registration.verified_name
        return endpoint.rpartition(":")[0]

    async def changed(self, timeout: float) -> None:
        """Wait for the next change (or ``timeout`` seconds)."""
        self._changed.clear()
        with contextlib.suppress(TimeoutError):
            await wait_for(self._changed.wait(), timeout)

    # --- kazoo thread -> loop -----------------------------------------------------------

    def _post(self, fn: Callable[[*Ts], object], *args: *Ts) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(fn, *args)

    def _cluster_changed(self, data: bytes | None, stat: ZnodeStat | None) -> None:
        if data is None:
            return  # deleted: the client's requests say so when they fail
        try:
            params = ClusterParams.decode(data)
        except MetadataError as e:
            log.error("ignoring an unreadable cluster node: %s", e)
            return
        self._post(self._set_params, params)

    def _set_params(self, params: ClusterParams) -> None:
        """The cluster node changed: only a growth of the partitions is taken."""
        current = self.params
        if current is None:
            return
        try:
            grown = current.grown_to(params)
        except MetadataError as e:
            log.error("ignoring the cluster node: %s", e)
            return
        if grown is None:
            return
        self.params = params
        log.info("the cluster grew from %d to %d partitions", current.num_partitions, grown)
        self._changed.set()
        if self.on_grown is not None:
            self.on_grown(current.num_partitions, grown)

    def _ownership_changed(self, data: bytes | None, stat: ZnodeStat | None) -> None:
        if data is None:
            return
        try:
            ownership = Ownership.decode(data)
        except MetadataError as e:
            log.error("ignoring an unreadable ownership node: %s", e)
            return
        self._post(self._set_ownership, ownership.partitions)

    def _set_ownership(self, partitions: dict[int, tuple[str | None, int]]) -> None:
        self.ownership = partitions
        self._changed.set()

    def _servers_changed(self, children: list[str]) -> None:
        self._post(self._load_servers, list(children))

    def _load_servers(self, children: list[str]) -> None:
        """Read the registrations off the loop (kazoo calls block)."""

        def read() -> dict[str, ServerRegistration]:
            zk = self._zk
            servers: dict[str, ServerRegistration] = {}
            for child in children:
                if zk is None:
                    break
                try:
                    data, _ = zk.get(self.paths.server(child))
                    servers[child] = ServerRegistration.decode(data)
                except (NoNodeError, MetadataError) as e:
                    log.debug("server %s: %s", child, e)
            return servers

        self._server_loads += 1
        load_number = self._server_loads

        async def load() -> None:
            try:
                servers = await asyncio.get_running_loop().run_in_executor(None, read)
            except Exception as e:  # the next change reads them again
                log.warning("reading the live servers failed: %r", e)
                return
            if load_number == self._server_loads:  # a newer change may have finished first
                self._set_servers(servers)

        spawn(load(), self._tasks, "reading the live servers", log)

    def _set_servers(self, servers: dict[str, ServerRegistration]) -> None:
        self.servers = servers
        self._changed.set()
