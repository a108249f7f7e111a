"""The operator's cluster monitor against real daemons and a real ZooKeeper: the quorum it
reports as storage nodes die and come back, a cluster that does not exist yet, metadata
changes seen through watches (not the scrape timer), and the operator's /metrics."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from kazoo.client import KazooClient

from waltz_client import (
    SubmitStatus,
    TransactionBuilder,
    TransactionContext,
    WaltzClient,
    WaltzClientConfig,
)
from waltz_client.cluster.admin import add_storage, create_cluster, delete_cluster
from waltz_client.cluster.metadata import ServerRegistration, key_fingerprint
from waltz_client.cluster.paths import ClusterPaths
from waltz_client.cluster.zk import close, connect
from waltz_operator.metrics import OperatorMetrics
from waltz_operator.monitor import ClusterMonitor, MonitorSettings
from waltz_operator.observe import ClusterView

pytestmark = pytest.mark.timeout(240)

FAST = MonitorSettings(scrape_interval=0.5, scrape_timeout=3.0, zk_timeout=10.0)
# Only a ZooKeeper change (a watch) or a refresh can start a round.
WATCH_ONLY = MonitorSettings(scrape_interval=3600, scrape_timeout=10.0, zk_timeout=10.0)
NOWHERE = "http://127.0.0.1:1/readyz"  # nothing listens: the node is down


class Put(TransactionContext):
    def __init__(self, partition: int) -> None:
        self.partition = partition

    def partition_id(self, num_partitions: int) -> int:
        return self.partition

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_data(b"monitored")
        return True


def summary(monitor: ClusterMonitor) -> str:
    view = monitor.view
    if view is None:
        return f"no view (ZooKeeper error: {monitor.zookeeper_error})"
    parts = [
        f"p{p.partition}: owner={p.owner} gen={p.generation} live={sorted(p.live)} "
        f"quorum={p.quorum} hwm={p.high_water_mark}"
        for p in view.partitions
    ]
    return f"{'; '.join(parts)}; storage_up={dict(view.storage_up)}; problems={view.problems}"


async def until(
    monitor: ClusterMonitor,
    what: str,
    predicate: Callable[[ClusterView | None], bool],
    timeout: float = 60.0,
) -> ClusterView | None:
    """Poll ``monitor.view`` (never asking for a refresh) until ``predicate`` holds."""
    deadline = time.monotonic() + timeout
    while True:
        view = monitor.view
        if predicate(view):
            return view
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout:g} s waiting for {what}: {summary(monitor)}"
            )
        await asyncio.sleep(0.1)


def client_config(cluster) -> WaltzClientConfig:
    # Appends lost when a store session fails are retried after request_timeout.
    return WaltzClientConfig(
        cluster.zookeeper_connect, zk_root=cluster.layout.root, feed=False, request_timeout=3.0
    )


async def write(cluster, counts: dict[int, int]) -> dict[int, int]:
    """Commit ``counts[p]`` transactions to each partition p; the highest ID per partition."""
    async with WaltzClient(client_config(cluster)) as client:
        contexts = [Put(p) for p, n in counts.items() for _ in range(n)]
        results = await asyncio.gather(*(client.submit(c) for c in contexts))
    assert {r.status for r in results} == {SubmitStatus.COMMITTED}, results
    hwm: dict[int, int] = {}
    for context, result in zip(contexts, results, strict=True):
        hwm[context.partition] = max(hwm.get(context.partition, -1), result.transaction_id)
    return hwm


async def append_without_waiting(cluster, partitions: list[int]) -> None:
    """Send appends that cannot commit (no quorum): the server notices the lost replicas."""
    client = await WaltzClient(client_config(cluster)).start()
    tasks = [asyncio.ensure_future(client.submit(Put(p))) for p in partitions]
    await asyncio.sleep(1)
    await client.close()
    await asyncio.gather(*tasks, return_exceptions=True)


async def operator_metrics(http: TestClient, *lines: str, timeout: float = 30.0) -> str:
    """The operator's /metrics text, once it has every one of ``lines`` (the next view may
    take a round)."""
    deadline = time.monotonic() + timeout
    while True:
        response = await http.get("/metrics")
        assert response.status == 200
        text = await response.text()
        missing = [line for line in lines if line not in text.splitlines()]
        if not missing:
            return text
        if time.monotonic() > deadline:
            raise AssertionError(f"/metrics lacks {missing}:\n{text}")
        await asyncio.sleep(0.2)


def test_the_monitor_follows_the_quorum_as_storage_nodes_die_and_return(make_cluster):
    cluster = make_cluster(partitions=2, servers=1, storages=3)
    addresses = cluster.layout.storage_addresses
    ready_urls = {
        address: f"http://127.0.0.1:{http_port}/readyz"
        for address, (_, http_port) in zip(addresses, cluster.layout.storage_ports, strict=True)
    }
    label = "testing/live"

    async def scenario() -> None:
        metrics = OperatorMetrics()
        figures = metrics.figures(label)

        def on_view(view: ClusterView | None) -> None:
            figures.view = view
            figures.zookeeper_reachable = monitor.zookeeper_error is None

        monitor = ClusterMonitor(
            cluster.zookeeper_connect, cluster.layout.root, ready_urls.get, FAST, on_view
        )
        try:
            async with TestClient(TestServer(metrics.app())) as http:
                await scenario_with(monitor, http)
        finally:
            await monitor.close()

    async def scenario_with(monitor: ClusterMonitor, http: TestClient) -> None:
        hwm = await write(cluster, {0: 5, 1: 3})
        assert hwm == {0: 4, 1: 2}

        # (a) Healthy: every partition in a 3-replica session, every node up.
        def healthy(view: ClusterView | None) -> bool:
            return (
                view is not None
                and all(
                    p.quorum and len(p.live) == 3 and p.high_water_mark == hwm[p.partition]
                    for p in view.partitions
                )
                and view.storage_up == dict.fromkeys(addresses, True)
            )

        view = await until(monitor, "a healthy view", healthy)
        assert view is not None and monitor.zookeeper_error is None
        assert [p.partition for p in view.partitions] == [0, 1]
        assert all(p.owner == "server-0" and p.generation >= 1 for p in view.partitions)
        assert all(set(p.assigned) == set(addresses) for p in view.partitions)
        assert view.servers == {"server-0": f"127.0.0.1:{cluster.servers[0].ready['http_port']}"}
        assert view.problems == ()
        assert [(o.live_replicas, o.quorum) for o in view.status_partitions()] == [(3, True)] * 2
        c = f'cluster="{label}"'
        await operator_metrics(
            http,
            f'waltz_operator_partition_quorum{{{c},partition="0"}} 1.0',
            f'waltz_operator_partition_quorum{{{c},partition="1"}} 1.0',
            f'waltz_operator_partition_replicas_live{{{c},partition="1"}} 3.0',
            f'waltz_operator_partition_high_water_mark{{{c},partition="0"}} 4.0',
            f'waltz_operator_partition_owner_info{{{c},owner="server-0",partition="0"}} 1.0',
            f"waltz_operator_zookeeper_reachable{{{c}}} 1.0",
        )
        health = await http.get("/healthz")
        assert (await health.json())["clusters"] == [label]

        # (b) One node down: a write starts a session of the other two; still a quorum.
        dead = addresses[2]
        cluster.storages[2].kill()
        hwm = await write(cluster, {0: 2, 1: 2})
        assert hwm[0] >= 6 and hwm[1] >= 4

        def two_live(view: ClusterView | None) -> bool:
            return (
                view is not None
                and all(
                    p.quorum
                    and p.live == set(addresses[:2])
                    and p.high_water_mark == hwm[p.partition]
                    for p in view.partitions
                )
                and view.storage_up == {**dict.fromkeys(addresses, True), dead: False}
            )

        await until(monitor, "two live replicas, still a quorum", two_live)
        await operator_metrics(
            http,
            f'waltz_operator_partition_replicas_live{{{c},partition="0"}} 2.0',
            f'waltz_operator_partition_quorum{{{c},partition="1"}} 1.0',
            f'waltz_operator_storage_node_up{{{c},node="{dead}"}} 0.0',
            f'waltz_operator_storage_node_up{{{c},node="{addresses[0]}"}} 1.0',
        )

        # A second node down: no partition can commit.
        cluster.storages[1].kill()
        await append_without_waiting(cluster, [0, 1])
        await until(
            monitor,
            "no quorum",
            lambda v: (
                v is not None
                # the owner answers, and says so (not merely a failed scrape)
                and all(p.reported is not None and not p.quorum for p in v.partitions)
                and v.storage_up[addresses[1]] is False
            ),
        )
        await operator_metrics(
            http,
            f'waltz_operator_partition_quorum{{{c},partition="0"}} 0.0',
            f'waltz_operator_partition_quorum{{{c},partition="1"}} 0.0',
            f'waltz_operator_storage_node_up{{{c},node="{addresses[1]}"}} 0.0',
        )

        # Both back: a quorum again, every node up.
        await asyncio.to_thread(cluster.storages[1].start)
        await asyncio.to_thread(cluster.storages[2].start)
        await until(
            monitor,
            "a quorum again",
            lambda v: (
                v is not None
                and all(p.quorum and p.high_water_mark >= hwm[p.partition] for p in v.partitions)
                and all(v.storage_up.values())
            ),
        )
        await operator_metrics(
            http,
            f'waltz_operator_partition_quorum{{{c},partition="0"}} 1.0',
            f'waltz_operator_partition_quorum{{{c},partition="1"}} 1.0',
        )

    asyncio.run(scenario())


def register_server(zk: KazooClient, root: str, server_id: str, http_port: int) -> None:
    registration = ServerRegistration(server_id, "127.0.0.1", 1, http_port)
    zk.create(ClusterPaths.of(root).server(server_id), registration.encode(), ephemeral=True)


def test_a_monitor_waits_for_its_cluster_and_follows_metadata_through_watches(zookeeper, zk_root):
    storages = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]

    async def scenario() -> None:
        monitor = ClusterMonitor(zookeeper.connect_string, zk_root, lambda a: NOWHERE, WATCH_ONLY)
        zk = await asyncio.to_thread(connect, zookeeper.connect_string)
        try:
            # (c) No cluster yet: no view, no error, no crash.
            assert await asyncio.wait_for(monitor.next_view(), 30) is None
            assert monitor.zookeeper_error is None
            await asyncio.sleep(0.5)
            assert monitor.view is None and monitor.zookeeper_error is None

            created = await asyncio.to_thread(create_cluster, zk, zk_root, "late", 3, 3, storages)
            # Only the watch on the cluster node can start this round (the timer is an hour).
            view = await until(monitor, "the new cluster", lambda v: v is not None, 30)
            assert view is not None
            assert (view.name, view.key) == ("late", key_fingerprint(created.params.key))
            assert len(view.partitions) == 3
            assert all(p.owner is None and not p.quorum for p in view.partitions)
            assert all(len(p.assigned) == 3 for p in view.partitions)
            assert view.storage_up == dict.fromkeys(storages, False)
            assert view.servers == {}

            # (d) Each kind of metadata change is seen through its watch.
            await asyncio.to_thread(add_storage, zk, zk_root, "127.0.0.1:4")
            await until(
                monitor, "the added node", lambda v: v and "127.0.0.1:4" in v.storage_up, 30
            )
            await asyncio.to_thread(register_server, zk, zk_root, "server-7", 1)
            await until(monitor, "the new server", lambda v: v and "server-7" in v.servers, 30)
            await asyncio.to_thread(zk.delete, ClusterPaths.of(zk_root).server("server-7"))
            await until(monitor, "the server gone", lambda v: v and v.servers == {}, 30)

            # Deleted: no view. Created again at the same root: followed again, servers too.
            await asyncio.to_thread(delete_cluster, zk, zk_root, "late")
            await until(monitor, "the cluster gone", lambda v: v is None, 30)
            again = await asyncio.to_thread(create_cluster, zk, zk_root, "again", 2, 3, storages)
            await until(monitor, "the cluster back", lambda v: v and v.name == "again", 30)
            assert monitor.view is not None
            assert monitor.view.key == key_fingerprint(again.params.key)
            await asyncio.to_thread(register_server, zk, zk_root, "server-8", 1)
            await until(
                monitor, "a server of the new cluster", lambda v: v and "server-8" in v.servers, 30
            )
            assert monitor.zookeeper_error is None
        finally:
            await monitor.close()
            await asyncio.to_thread(close, zk)

    asyncio.run(scenario())


def test_undecodable_metadata_is_reported_and_retried_without_spinning(zookeeper, zk_root):
    paths = ClusterPaths.of(zk_root)
    settings = MonitorSettings(scrape_interval=3600, scrape_timeout=5.0, retry_interval=0.5)

    async def scenario() -> None:
        zk = await asyncio.to_thread(connect, zookeeper.connect_string)
        await asyncio.to_thread(zk.create, paths.cluster, b"not json", makepath=True)
        monitor = ClusterMonitor(zookeeper.connect_string, zk_root, lambda a: NOWHERE, settings)
        try:
            await asyncio.wait_for(monitor.next_view(), 30)
            assert monitor.view is None
            assert monitor.zookeeper_error is not None and "cluster" in monitor.zookeeper_error
            rounds = monitor.rounds
            await asyncio.sleep(2)
            # Retried every half second or so, not as fast as the loop can go.
            assert 1 <= monitor.rounds - rounds <= 20, monitor.rounds - rounds
            # Repaired: followed (the retry, or the watch, reads it).
            await asyncio.to_thread(zk.delete, zk_root, recursive=True)
            await asyncio.to_thread(create_cluster, zk, zk_root, "fixed", 1, 1, ["127.0.0.1:1"])
            view = await until(monitor, "the repaired cluster", lambda v: v is not None, 30)
            assert view is not None and view.name == "fixed"
            assert monitor.zookeeper_error is None
        finally:
            await monitor.close()
            await asyncio.to_thread(close, zk)

    asyncio.run(scenario())


def test_next_view_reads_zookeeper_after_it_is_called(zookeeper, zk_root):
    """A round already scraping read ZooKeeper before the caller's change: next_view()
    must not hand its view back."""

    async def scenario() -> None:
        entered = asyncio.Event()  # a scrape of the server's /metrics began
        release = asyncio.Event()  # it may answer

        async def slow_metrics(_: web.Request) -> web.Response:
            entered.set()
            await release.wait()
            return web.Response(text="")

        app = web.Application()
        app.router.add_get("/metrics", slow_metrics)
        zk = await asyncio.to_thread(connect, zookeeper.connect_string)
        async with TestServer(app) as server:
            await asyncio.to_thread(create_cluster, zk, zk_root, "slow", 1, 1, ["127.0.0.1:1"])
            await asyncio.to_thread(register_server, zk, zk_root, "server-0", server.port)
            release.set()
            monitor = ClusterMonitor(zookeeper.connect_string, zk_root, lambda a: None, WATCH_ONLY)
            try:
                await until(monitor, "the cluster", lambda v: v and "server-0" in v.servers, 30)
                release.clear()
                entered.clear()
                monitor.refresh()
                await asyncio.wait_for(entered.wait(), 30)  # a round is scraping
                await asyncio.to_thread(add_storage, zk, zk_root, "127.0.0.1:2")
                waiting = asyncio.ensure_future(monitor.next_view())
                await asyncio.sleep(0.5)
                release.set()
                view = await asyncio.wait_for(waiting, 30)
                assert view is not None
                assert set(view.storage_up) == {"127.0.0.1:1", "127.0.0.1:2"}
            finally:
                release.set()
                await monitor.close()
                await asyncio.to_thread(close, zk)

    asyncio.run(scenario())
