"""An idle store session notices a member that stopped answering (a paused storage node,
which sends no reset) by pinging it, and the next session leaves it out, before any
append has to find out; when it answers again it rejoins. Real processes."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

import pytest
from server_harness import Put, longest_gap_while_paused, wait_for

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


def test_over_tls_a_paused_replica_does_not_hold_recovery_for_the_tls_close(make_cluster):
    """A paused storage node never answers TLS's close_notify, and asyncio waits 30 s for
    it by default: the partition's recovery waited that long before dialling the others.
    Closing now gives up on a silent peer after a second."""
    cluster = make_cluster(partitions=1, tls=True, server_args=["--storage-timeout", "2"])
    config = WaltzClientConfig(
        cluster.zookeeper_connect,
        zk_root=cluster.layout.root,
        feed=False,
        tls=cluster.client_tls,
        zk_tls=cluster.client_zk_tls,
    )

    # Writes of 64 KiB keep the connections' buffers full.
    gap = longest_gap_while_paused(cluster, config, b"x" * 65536, 16, settled_after=12)
    log = Path(cluster.servers[0].log_path).read_text()
    assert "SSL shutdown timed out" not in log
    # Expected: a 2 s ping, a 2 s dial of the paused node, and the recovery; the old wait
    # for the TLS close alone was 30 s.
    assert gap < 20, f"no commit for {gap:.1f} s"
