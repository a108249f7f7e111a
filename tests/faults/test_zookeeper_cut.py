"""An owner cut off from ZooKeeper while it still reaches its storage nodes and clients.

Only the owning server's link to ZooKeeper is cut (both ways): ZooKeeper's port is
shared by every process of the cluster, so the cut matches the server's sockets by the
cgroup it was started in (see netcut.py). Its ZooKeeper session expires, the other
server takes the partition with a higher generation, and that server's recovery fences
the old owner's store session on the storage nodes. The old owner is still running and
still reachable: it must never commit again. Then the link is healed and the old owner
comes back as an ordinary server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest
from fault_harness import (
    PartitionClient,
    check_log,
    http_json,
    keep_appending,
    owner_of,
    partition_health,
    settle,
    wait_for,
)

from waltz_client.wire.server_connection import ServerConnectionClosed

pytestmark = pytest.mark.timeout(240)

log = logging.getLogger(__name__)


def restart_in(group, proc) -> None:
    """Restart a daemon inside ``group``, so that every socket it opens belongs to it."""
    proc.stop()
    proc.command = group.wrap(proc.command)
    proc.start()


def owners(cluster) -> dict[int, str | None]:
    return {p: owner for p, (owner, _) in cluster.ownership().items()}


def balanced(cluster) -> bool:
    """Each server owns one of the two partitions and serves it (its /healthz is ok)."""
    by_owner = owners(cluster)
    if sorted(by_owner.values(), key=str) != ["server-0", "server-1"]:
        return False
    return all(http_json(proc, "/healthz")[0] == 200 for proc in cluster.servers)


def test_an_owner_cut_off_from_zookeeper_is_fenced_and_rejoins(cgroup_links, make_cluster):
    links = cgroup_links
    cluster = make_cluster(partitions=2, servers=2)
    zk_port = int(cluster.zookeeper_connect.rsplit(":", 1)[1])
    groups = [links.group(proc.name) for proc in cluster.servers]
    for group, proc in zip(groups, cluster.servers, strict=True):
        restart_in(group, proc)
    wait_for(lambda: balanced(cluster), 120, "each server to own and serve one partition")
    old, old_generation = owner_of(cluster, 0)
    new = 1 - old
    old_server, new_server = cluster.servers[old], cluster.servers[new]

    async def scenario():
        # ``writer`` appends all along, through whichever server it can mount at.
        # ``stale`` stays on its connection to the old owner and appends there after the
        # new owner has recovered: none of those may ever commit.
        writer, stale = PartitionClient(cluster, 0), PartitionClient(cluster, 0)
        await writer.mount()
        await stale.mount()
        for i in range(50):
            stale.append(b"stale-before-%d" % i)
        await stale.flush()
        stop = asyncio.Event()
        load = asyncio.create_task(keep_appending(writer, stop, b"w"))
        await writer.wait_feed(100, timeout=120)

        links.cut(groups[old], zk_port)
        new_owner, generation = await asyncio.to_thread(
            cluster.owner_index, 0, f"server-{old}", 120
        )
        assert new_owner == new and generation > old_generation
        # Once the new owner is active, its recovery has fenced the old store session
        # on the storage nodes (all three are reachable): nothing the old owner commits
        # can lie beyond the high-water mark the new owner reports then.
        recovered = await asyncio.to_thread(
            wait_for,
            lambda: (
                (h := partition_health(new_server, 0)).get("state") == "active"
                and h.get("generation") == generation
                and h
            ),
            120,
            "the new owner to recover the partition",
        )
        stale_after = [stale.append(b"stale-after-%d" % i) for i in range(50)]
        # The old owner tries them, is refused, and cannot recover without ZooKeeper.
        await asyncio.to_thread(
            wait_for,
            lambda: "SESSION_FENCED" in read(old_server.log_path),
            120,
            "the old owner's store session to be fenced",
        )
        await asyncio.to_thread(
            wait_for,
            lambda: partition_health(old_server, 0).get("state") == "recovering",
            120,
            "the old owner to go back to recovering the partition",
        )
        # Meanwhile the writer has moved to the new owner and commits there.
        await writer.wait_feed(writer.high_water_mark + 200, timeout=120)
        assert links.dropped() > 0, "the cut dropped nothing"

        links.heal()
        # Back on ZooKeeper the old owner learns its session expired, stops everything,
        # registers again and gets a partition back from the rebalance.
        await asyncio.to_thread(
            wait_for,
            lambda: "ZooKeeper session lost" in read(old_server.log_path),
            120,
            "the old owner to find its ZooKeeper session expired",
        )
        await asyncio.to_thread(wait_for, lambda: balanced(cluster), 120, "a rebalance")
        assert http_json(old_server, "/readyz")[0] == 200
        back = next(p for p, owner in owners(cluster).items() if owner == f"server-{old}")
        rejoined = PartitionClient(cluster, back)
        await rejoined.mount()
        assert rejoined.conn is not None
        appended = [rejoined.append(b"rejoined-%d" % i) for i in range(20)]
        await rejoined.flush()
        assert set(appended) <= rejoined.committed(), "the rejoined server did not commit"

        await writer.wait_feed(writer.high_water_mark + 100, timeout=120)
        stop.set()
        await load
        await settle(writer)
        reader = PartitionClient(cluster, 0)
        await reader.mount()
        await reader.wait_feed(writer.high_water_mark, timeout=120)
        assert reader.feed == writer.feed, "two readers saw different logs"
        assert stale.feed == writer.feed[: len(stale.feed)], "the old owner's feed diverged"
        assert stale.high_water_mark <= recovered["high_water_mark"], (
            "the old owner committed after the new owner's recovery"
        )
        for client in (writer, stale, reader, rejoined):
            with contextlib.suppress(ServerConnectionClosed, ConnectionError):
                await client.close()
        return writer.feed, stale.feed, stale_after, back, rejoined.feed

    feed, stale_feed, stale_after, back, rejoined_feed = asyncio.run(scenario())
    assert "Traceback" not in read(old_server.log_path)
    cluster.stop()
    records = check_log(cluster, 0, [feed, stale_feed])
    assert len(records) == len(feed)
    assert not set(stale_after) & {r.req_id for r in records}, (
        "an append sent to the fenced old owner was committed"
    )
    if back != 0:
        check_log(cluster, back, [rejoined_feed])


def read(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()
