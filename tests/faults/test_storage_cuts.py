"""A server's links to its storage nodes cut with nftables (by the storage node's port,
which only the server talks to), on real processes: with one node cut the partition
commits on the other two and the node rejoins once healed; with two cut commits stop
until they are healed, and nothing acknowledged is lost or committed twice."""

from __future__ import annotations

import asyncio
import logging
import re
import urllib.request

import pytest
from fault_harness import (
    PartitionClient,
    check_log,
    http_json,
    keep_appending,
    partition_health,
    settle,
    wait_for,
)

pytestmark = pytest.mark.timeout(240)

log = logging.getLogger(__name__)

# /healthz statuses of a partition that waits for storage nodes (docs/server.md, Recovery)
WAITING = ("waiting: ", "recovery retrying: ")


def metric(proc, name: str, partition: int) -> float | None:
    """One per-partition gauge from the server's /metrics, None if absent."""
    url = f"http://127.0.0.1:{proc.ready['http_port']}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    m = re.search(rf'^{name}{{partition="{partition}"}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else None


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_a_server_cut_from_one_storage_node_commits_on_the_other_two(links, make_cluster, tls):
    # A replica more than 100 transactions behind is copied back in the background while
    # the partition commits (docs/server.md, "Catching up a lagging replica"). Once over
    # mutual TLS too: reconnecting after the cut is a new TLS handshake.
    cluster = make_cluster(server_args=["--catch-up-inline-records", "100"], tls=tls)
    server = cluster.servers[0]
    cut_node = cluster.storages[2]

    async def scenario() -> list:
        writer = PartitionClient(cluster, 0)
        await writer.mount()
        stop = asyncio.Event()
        load = asyncio.create_task(keep_appending(writer, stop, b"w", stall=30))
        await writer.wait_feed(100, timeout=120)
        await asyncio.to_thread(
            wait_for,
            lambda: metric(server, "waltz_server_partition_live_replicas", 0) == 3,
            120,
            "a store session with all three storage nodes",
        )

        links.cut(None, cut_node.ready["port"])
        # The session ends without the silent node and the next one commits on two.
        await asyncio.to_thread(
            wait_for,
            lambda: metric(server, "waltz_server_partition_live_replicas", 0) == 2,
            120,
            "a store session without the cut storage node",
        )
        mark = writer.high_water_mark
        await writer.wait_feed(mark + 300, timeout=120)  # a hang guard
        assert links.dropped() > 0, "the cut dropped nothing"

        links.heal()
        # The node answers the probe again and is copied back in.
        await asyncio.to_thread(
            wait_for,
            lambda: metric(server, "waltz_server_partition_live_replicas", 0) == 3,
            120,
            "the healed storage node to rejoin the store session",
        )
        await writer.wait_feed(writer.high_water_mark + 100, timeout=120)
        stop.set()
        await load
        await settle(writer)
        reader = PartitionClient(cluster, 0)
        await reader.mount()
        await reader.wait_feed(writer.high_water_mark, timeout=120)
        assert reader.feed == writer.feed, "two readers saw different logs"
        await writer.close()
        await reader.close()
        return writer.feed

    feed = asyncio.run(scenario())
    cluster.stop()
    records = check_log(cluster, 0, [feed])
    assert len(records) == len(feed)
    with open(server.log_path) as f:
        copied = "catching up replica" in f.read()
    log.info("the healed replica was copied %s", "in the background" if copied else "inline")


def test_a_server_cut_from_two_storage_nodes_stops_committing_until_healed(links, make_cluster):
    cluster = make_cluster()
    server = cluster.servers[0]

    async def scenario() -> tuple[list, list]:
        writer = PartitionClient(cluster, 0)
        await writer.mount()
        for i in range(100):
            writer.append(b"before-%d" % i)
        await writer.flush()
        acknowledged = list(writer.feed)
        assert len(acknowledged) == 100

        for node in cluster.storages[1:]:
            links.cut(None, node.ready["port"])
        during = [writer.append(b"during-%d" % i) for i in range(50)]
        # No quorum: the session ends, and recovery waits for a majority (the vote cannot
        # be decided, or too few replicas are clean).
        health = await asyncio.to_thread(
            wait_for,
            lambda: (h := partition_health(server, 0)).get("status", "").startswith(WAITING) and h,
            120,
            "recovery to wait for the storage nodes",
        )
        assert health["state"] == "recovering", health
        code, body = http_json(server, "/healthz")
        assert code == 503 and body["unhealthy_partitions"] == [0], body
        assert metric(server, "waltz_server_partition_active", 0) == 0
        assert writer.feed == acknowledged, "committed without a quorum"
        assert links.dropped() > 0
        log.info("while cut from two storage nodes: %s", health["status"])

        links.heal()
        await settle(writer)
        after = [writer.append(b"after-%d" % i) for i in range(50)]
        await settle(writer)
        assert set(after) <= writer.committed()
        assert writer.feed[: len(acknowledged)] == acknowledged
        assert partition_health(server, 0).get("state") == "active"
        await writer.close()
        return writer.feed, during

    feed, during = asyncio.run(scenario())
    cluster.stop()
    records = check_log(cluster, 0, [feed])
    assert len(records) == len(feed)
    log.info(
        "%d of the %d appends sent while cut committed after healing",
        len(set(during) & {r.req_id for r in records}),
        len(during),
    )
