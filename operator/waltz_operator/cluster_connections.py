"""What the operator keeps open to each cluster across reconciles: its monitor, and a
ZooKeeper connection (shared by the clusters on the same ZooKeeper with the same
credential and certificate), reached with the access its spec's Secrets give."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping
from typing import Any

from kazoo.client import KazooClient

from waltz_client.cluster import admin
from waltz_client.cluster.metadata import ReplicaAssignment
from waltz_client.cluster.zk import close, connect

from .bootstrap import Created, Refused, Unsupported, cluster_name, ensure_cluster
from .kube import KubeApi
from .metrics import OperatorMetrics
from .monitor import ClusterMonitor, HttpsScrape
from .observe import ClusterView
from .owned import Key
from .reconcile_settings import ReconcileSettings, default_storage_http
from .spec import ClusterSpec
from .zk_secrets import ZkAccess, zk_access


class ClusterConnections:
    def __init__(
        self, kube: KubeApi, metrics: OperatorMetrics, settings: ReconcileSettings
    ) -> None:
        self.kube = kube
        self.metrics = metrics
        self.settings = settings
        self.monitors: dict[str, ClusterMonitor] = {}
        self._zk: dict[tuple[str, ZkAccess], KazooClient] = {}
        self._accesses: dict[str, ZkAccess] = {}  # cluster -> how it reaches ZooKeeper

    async def close(self) -> None:
        for monitor in self.monitors.values():
            await monitor.close()
        self.monitors.clear()
        for zk in self._zk.values():
            await asyncio.to_thread(close, zk)
        self._zk.clear()

    async def forget(self, spec: ClusterSpec) -> None:
        """Stop following the cluster (its ZooKeeper connection may serve others)."""
        monitor = self.monitors.pop(cluster_name(spec), None)
        if monitor is not None:
            await monitor.close()

    def monitor(self, spec: ClusterSpec, https: HttpsScrape | None = None) -> ClusterMonitor:
        key = cluster_name(spec)
        figures = self.metrics.figures(key)
        monitor = self.monitors.get(key)
        access = self._accesses.get(key, ZkAccess())
        if monitor is not None and (
            monitor.connect_string,
            monitor.root,
            monitor.access,
            monitor.https,
        ) != (spec.zookeeper, spec.zk_root, access, https):
            asyncio.get_running_loop().create_task(monitor.close())
            monitor = None
        if monitor is None:

            def on_view(view: ClusterView | None, m_key: str = key) -> None:
                figures.view = view
                m = self.monitors.get(m_key)
                figures.zookeeper_reachable = m is not None and m.zookeeper_error is None

            storage_http = self.settings.storage_http
            if https is not None and storage_http is default_storage_http:
                storage_http = functools.partial(default_storage_http, scheme="https")
            monitor = ClusterMonitor(
                spec.zookeeper,
                spec.zk_root,
                storage_http,
                self.settings.monitor,
                on_view,
                access,
                https,
            )
            self.monitors[key] = monitor
        return monitor

    async def resolve_access(
        self, spec: ClusterSpec, live: Mapping[Key, Mapping[str, Any]] | None = None
    ) -> ZkAccess:
        """Read the Secrets the spec names for ZooKeeper (SecretProblem if unusable); the
        credential the operator made is watched: no read for it."""

        async def get_secret(namespace: str, name: str) -> Mapping[str, Any] | None:
            found = (live or {}).get(("Secret", namespace, name))
            return found if found is not None else await self.get_secret(namespace, name)

        access = await zk_access(spec, get_secret, self.settings.secret_dir)
        self._accesses[cluster_name(spec)] = access
        return access

    async def get_secret(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return await self.kube.get("Secret", namespace, name)

    async def zookeeper(self, spec: ClusterSpec) -> KazooClient:
        access = self._accesses.get(cluster_name(spec), ZkAccess())
        key = (spec.zookeeper, access)
        zk = self._zk.get(key)
        if zk is not None and zk.connected:
            return zk
        if zk is not None:
            await asyncio.to_thread(close, zk)
        zk = await asyncio.to_thread(
            lambda: connect(spec.zookeeper, self.settings.zk_timeout, **access.connect_arguments)
        )
        self._zk[key] = zk
        return zk

    async def admin(self, spec: ClusterSpec, call: Callable[..., Any], *args: Any) -> Any:
        """An admin-library call on the cluster's ZooKeeper, off the event loop."""
        zk = await self.zookeeper(spec)
        return await asyncio.to_thread(call, zk, spec.zk_root, *args)

    async def ensure_cluster(
        self, spec: ClusterSpec, known_key: str | None
    ) -> Created | Refused | Unsupported:
        zk = await self.zookeeper(spec)
        return await asyncio.to_thread(ensure_cluster, zk, spec, known_key)

    async def assignment(self, spec: ClusterSpec) -> ReplicaAssignment:
        zk = await self.zookeeper(spec)
        assignment, _ = await asyncio.to_thread(admin.read_assignment, zk, spec.zk_root)
        return assignment
