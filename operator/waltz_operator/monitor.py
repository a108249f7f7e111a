"""Follows one cluster's quorum state: ZooKeeper watches and scrapes of its daemons.

kazoo watches on the cluster's metadata (its parameters, the assignment, ownership, the
servers, every partition) mark the metadata changed; the monitor then reads it once
(``read_cluster``), off the event loop. The servers' and storage nodes' endpoints are
scraped every ``scrape_interval`` seconds (their figures move with every write, so there
is nothing to watch). Each round produces a new ``ClusterView`` (observe.py), which feeds
the status conditions and the operator's ``/metrics``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import aiohttp
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import NoNodeError

from waltz_client.cluster.admin import ClusterState, read_cluster
from waltz_client.cluster.errors import ClusterError
from waltz_client.cluster.paths import ClusterPaths
from waltz_client.cluster.zk import close, connect
from waltz_client.runtime.tasks import wait_for
from waltz_client.wire.errors import describe

from .observe import ClusterView, ServerPartition, combine, parse_server_metrics
from .zk_secrets import ZkAccess

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class HttpsScrape:
    """The daemons' HTTP ports serve HTTPS (spec.tls.mode operator): checked against the
    cluster's CA; a server for the name it publishes (its pod IP is in no certificate), a
    storage node for the host name its URL dials."""

    ca_pem: bytes

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cadata=self.ca_pem.decode())


@dataclass(frozen=True)
class MonitorSettings:
    scrape_interval: float = 10.0
    scrape_timeout: float = 5.0
    zk_timeout: float = 10.0
    retry_interval: float = 2.0  # after a failed round (ZooKeeper unreachable, bad metadata)


class ClusterMonitor:
    """``view`` is the latest ClusterView (None until the cluster exists and was read);
    ``zookeeper_error`` says why ZooKeeper is not followed now (None: it is)."""

    def __init__(
        self,
        connect_string: str,
        root: str,
        storage_http: Callable[[str], str | None],
        settings: MonitorSettings = MonitorSettings(),
        on_view: Callable[[ClusterView | None], None] = lambda view: None,
        access: ZkAccess | None = None,
        https: HttpsScrape | None = None,
    ) -> None:
        self.connect_string = connect_string
        self.access = access or ZkAccess()  # the credential and certificate to reach ZooKeeper with
        self.root = root
        self.https = https
        self._ssl: ssl.SSLContext | bool = https.context() if https is not None else True
        self.paths = ClusterPaths.of(root)
        self._storage_http = storage_http
        self.settings = settings
        self._on_view = on_view
        self.view: ClusterView | None = None
        self.zookeeper_error: str | None = "not connected yet"
        self.rounds = 0
        self._zk: KazooClient | None = None
        self._closing = False
        self._changed = asyncio.Event()
        self._updated = asyncio.Condition()
        self._reads = 0  # ZooKeeper reads begun (a failed connect counts as one)
        self._read_done = 0  # the latest read whose round has finished
        self._watched: set[str] = set()
        self._watch_lock = threading.Lock()
        self._busy = threading.Lock()  # held by a worker thread using the client
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._run(), name=f"monitor {root}")

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await asyncio.to_thread(self._close_client)

    def _close_client(self) -> None:
        """Cancelling the task does not stop a read under way in its thread: let it
        finish first (a kazoo request made as the client stops may never be answered,
        leaving its thread, and asyncio.run's shutdown, waiting forever)."""
        with self._watch_lock:  # a connect still running in its thread closes its own
            self._closing = True
        finished = self._busy.acquire(timeout=self.settings.zk_timeout)
        try:
            with self._watch_lock:
                zk, self._zk = self._zk, None
        finally:
            if finished:
                self._busy.release()
        if zk is not None:
            close(zk)

    def refresh(self) -> None:
        """Read ZooKeeper and scrape now (after the operator changed something)."""
        self._loop.call_soon(self._changed.set)

    async def next_view(self) -> ClusterView | None:
        """Wait for a round that read ZooKeeper after this call to finish; its view (a
        round already under way may have read it before a change the caller just made)."""
        wanted = self._reads + 1
        self.refresh()
        async with self._updated:
            await self._updated.wait_for(lambda: self._read_done >= wanted)
        return self.view

    # --- the loop --------------------------------------------------------------------

    async def _run(self) -> None:
        async with aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=self.settings.scrape_timeout)
        ) as http:
            state: ClusterState | None = None
            stale = True  # ZooKeeper must be read before the next scrape
            while True:
                pause = self.settings.scrape_interval
                try:
                    if self._changed.is_set() or stale or self._zk is None:
                        self._changed.clear()
                        stale = True
                        self._reads += 1
                        if self._zk is None:
                            await asyncio.to_thread(self._exclusive, self._connect)
                        state = await asyncio.to_thread(self._exclusive, self._read)
                        stale = False
                    self.zookeeper_error = None
                    self.view = await self._scrape(http, state) if state is not None else None
                except Exception as e:  # ZooKeeper unreachable, undecodable metadata...
                    # Never keep a view from before the failure: nobody may act on a
                    # quorum the monitor no longer sees. Retry soon, but do not spin.
                    error = str(e) if isinstance(e, ClusterError) else describe(e)
                    if error != self.zookeeper_error:
                        log.warning("cluster at %s: %s", self.root, error)
                    self.zookeeper_error = error
                    self.view = None
                    pause = min(pause, self.settings.retry_interval)
                self.rounds += 1
                try:
                    self._on_view(self.view)
                except Exception:  # the callback's bug must not stop the monitor
                    log.exception("cluster at %s: on_view failed", self.root)
                async with self._updated:
                    self._read_done = self._reads
                    self._updated.notify_all()
                with contextlib.suppress(TimeoutError):
                    await wait_for(self._changed.wait(), timeout=pause)

    def _exclusive(self, work: Callable[[], T]) -> T:
        """In a worker thread: ``work``, while close() waits for it."""
        with self._busy:
            return work()

    def _connect(self) -> None:
        """In a worker thread: connect, follow the connection's state and the cluster
        node (the cluster may not exist yet)."""
        if self._closing:
            raise ClusterError("the monitor is closed")
        zk = connect(self.connect_string, self.settings.zk_timeout, **self.access.connect_arguments)
        with self._watch_lock:
            if self._closing:  # closed while we connected
                close(zk)
                raise ClusterError("the monitor is closed")
            self._zk = zk
        zk.add_listener(self._on_state)
        self._watch(self.paths.cluster)

    def _on_state(self, state: KazooState) -> None:
        """From kazoo's thread: read again on a lost, suspended or regained connection
        (a lost one makes the read fail and say so)."""
        self._mark_changed()

    def _read(self) -> ClusterState | None:
        zk = self._zk
        if zk is None or self._closing:
            raise ClusterError("the monitor is closed")
        if not zk.connected:
            raise ClusterError(f"ZooKeeper at {self.connect_string}: connection lost")
        if zk.exists(self.paths.cluster) is None:
            return None
        # A one-shot watch, armed again by every read: kazoo's ChildrenWatch stops for
        # good once its node is deleted (a cluster deleted and created again).
        with contextlib.suppress(NoNodeError):  # read_cluster says what is missing
            zk.get_children(self.paths.servers, watch=self._servers_changed)
        try:
            state = read_cluster(zk, self.root)
        except NoNodeError:  # created or deleted while we read
            return None
        for path in (
            self.paths.assignment,
            self.paths.ownership,
            *(self.paths.partition(p) for p in range(state.params.num_partitions)),
        ):
            self._watch(path)
        return state

    def _watch(self, path: str) -> None:
        with self._watch_lock:
            if path in self._watched or self._zk is None:
                return
            self._watched.add(path)
        self._zk.DataWatch(path, lambda data, stat, event=None: self._mark_changed())

    def _servers_changed(self, event: object) -> None:
        self._mark_changed()

    def _mark_changed(self) -> None:
        """From kazoo's thread."""
        with contextlib.suppress(RuntimeError):  # the event loop is closed
            self._loop.call_soon_threadsafe(self._changed.set)

    async def _scrape(self, http: aiohttp.ClientSession, state: ClusterState) -> ClusterView:
        scheme = "https" if self.https is not None else "http"
        servers = {
            s: (f"{scheme}://{_url_host(r.host)}:{r.http_port}/metrics", r.verified_name)
            for s, r in state.servers.items()
        }
        storage = {a: self._storage_http(a) for a in state.assignment.storages}

        async def server(server_id: str, target: tuple[str, str]) -> tuple[str, dict | str]:
            url, name = target
            tls: dict = {"ssl": self._ssl}
            if self.https is not None:
                tls["server_hostname"] = name
            try:
                async with http.get(url, **tls) as response:
                    text = await response.text()
                    if response.status != 200:
                        return server_id, f"{url} answered {response.status}"
                return server_id, parse_server_metrics(text)
            except (aiohttp.ClientError, TimeoutError, ValueError) as e:
                return server_id, f"{url}: {describe(e)}"

        async def ready(address: str, url: str | None) -> tuple[str, bool]:
            if url is None:
                return address, False
            try:
                async with http.get(url, ssl=self._ssl) as response:
                    return address, response.status == 200
            except (aiohttp.ClientError, TimeoutError):
                return address, False

        results = await asyncio.gather(
            *(server(s, u) for s, u in sorted(servers.items())),
        )
        up = dict(await asyncio.gather(*(ready(a, u) for a, u in sorted(storage.items()))))
        scrapes: dict[str, dict[int, ServerPartition]] = {}
        errors: dict[str, str] = {}
        for server_id, result in results:
            if isinstance(result, str):
                errors[server_id] = result
            else:
                scrapes[server_id] = result
        return combine(state, scrapes, up, errors)


def _url_host(host: str) -> str:
    """A host as a URL has it: an IPv6 address (a pod IP) in brackets."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
