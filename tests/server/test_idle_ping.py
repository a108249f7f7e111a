"""An idle store session notices a member that stopped answering (a paused storage node,
which sends no reset) by pinging it, and the next session leaves it out, before any
append has to find out; when it answers again it rejoins. Real processes."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

import pytest
from server_harness import Put, wait_for

from waltz_client import WaltzClient, WaltzClientConfig

pytestmark = pytest.mark.timeout(300)


def server_metric(cluster, name: str) -> float:
    port = cluster.servers[0].ready["http_port"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith(f'waltz_server_partition_{name}{{partition="0"}}'):
            return float(line.split()[-1])
    return -1.0


def test_an_idle_session_leaves_out_a_member_that_stopped_answering(make_cluster):
    cluster = make_cluster(partitions=1, server_args=["--storage-timeout", "2"])
    config = WaltzClientConfig(cluster.zookeeper_connect, zk_root=cluster.layout.root, feed=False)

    async def append() -> None:
        async with WaltzClient(config) as client:
            assert await client.submit(Put())

    asyncio.run(append())
    wait_for(lambda: server_metric(cluster, "live_replicas") == 3, what="3 live replicas")
    sessions = server_metric(cluster, "sessions_total")

    cluster.storages[1].pause()
    try:
        # No append: only the ping can find it out.
        wait_for(
            lambda: (
                server_metric(cluster, "live_replicas") == 2
                and server_metric(cluster, "sessions_total") > sessions
            ),
            timeout=60,
            what="a session without the paused replica",
        )
    finally:
        cluster.storages[1].resume()
    log = Path(cluster.servers[0].log_path).read_text()
    assert "did not answer a ping within 2 s" in log
    asyncio.run(append())  # the two others commit
    wait_for(lambda: server_metric(cluster, "live_replicas") == 3, timeout=90, what="it to rejoin")
