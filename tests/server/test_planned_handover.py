"""A planned stop (SIGTERM, as `waltz local`, systemd and Kubernetes send) hands the
server's partitions over before it leaves: one ZooKeeper transaction gives them to the
other server while the stopping one still holds its session, and a producer writing
throughout loses nothing. A server with nobody to hand over to stops as before. Real
daemons, real ZooKeeper."""

from __future__ import annotations

import asyncio
import logging
import re
import time

import pytest
from server_harness import Put, ownership, read_all, wait_for

from waltz_client import WaltzClient, WaltzClientConfig, partition_driver
from waltz_client.client import SubmitStatus
from waltz_client.cluster_view import ClusterView

pytestmark = pytest.mark.timeout(240)

PARTITIONS = 4
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def logged_at(path: str, text: str) -> list[str]:
    """The timestamps of the lines of the log at ``path`` that contain ``text``."""
    with open(path, encoding="utf-8") as f:
        return [m.group(1) for line in f if text in line and (m := STAMP.match(line))]


def two_servers(make_cluster, partitions: int):
    """A cluster of two servers once both own partitions; the index of the one owning
    partition 0 (the one to stop)."""
    cluster = make_cluster(partitions=partitions, servers=2)
    wait_for(
        lambda: {owner for owner, _ in ownership(cluster).values()} == {"server-0", "server-1"},
        what="both servers owning partitions",
    )
    leaving = ownership(cluster)[0][0]
    assert leaving is not None
    return cluster, int(leaving.rsplit("-", 1)[1])


def test_a_stopped_server_hands_its_partitions_over_before_its_session_ends(make_cluster):
    cluster, index = two_servers(make_cluster, PARTITIONS)
    leaving = f"server-{index}"
    staying = f"server-{1 - index}"
    moved = sorted(p for p, (owner, _) in ownership(cluster).items() if owner == leaving)
    config = WaltzClientConfig(
        cluster.zookeeper_connect, zk_root=cluster.layout.root, feed=False, max_retries=100
    )
    acknowledged: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}

    async def scenario() -> int | None:
        stopping = False
        async with WaltzClient(config) as client:

            async def produce(p: int) -> None:
                i = 0
                while not stopping or i < 20:
                    data = b"%d-%d" % (p, i)
                    if (await client.submit(Put(data, p))).status == SubmitStatus.COMMITTED:
                        acknowledged[p].append(data)
                    i += 1

            producers = [asyncio.ensure_future(produce(p)) for p in range(PARTITIONS)]
            await asyncio.sleep(0.5)
            code = await asyncio.to_thread(cluster.servers[index].stop)
            stopping = True
            await asyncio.gather(*producers)
        return code

    code = asyncio.run(scenario())
    assert code == 0, cluster.servers[index].log_tail()

    log = cluster.servers[index].log_path
    handed = logged_at(log, f"partitions handed over to {staying}")
    closed = logged_at(log, "ZooKeeper session closed")
    assert handed and closed, cluster.servers[index].log_tail(40)
    # The other server took them up while this one still held its session: from the
    # hand-over, not from the session's end.
    other_log = cluster.servers[1 - index].log_path
    for p in moved:
        serving = logged_at(other_log, f"partition {p}: serving with generation")
        assert serving and serving[-1] <= closed[-1], (p, serving, closed)
    assert {owner for owner, _ in ownership(cluster).values()} == {staying}
    for p in range(PARTITIONS):
        assert len(acknowledged[p]) >= 20
        assert read_all(cluster, p) == acknowledged[p], f"partition {p}"

    # The last server has nobody to hand over to: it stops as before.
    started = time.monotonic()
    assert cluster.servers[1 - index].stop() == 0
    assert time.monotonic() - started < 15
    assert logged_at(other_log, "no other server to hand the partitions over to")


def test_after_its_feed_is_suspended_a_client_mounts_at_the_new_owner_not_the_old(
    make_cluster, monkeypatch, caplog
):
    """The old owner suspends the moved partitions' feeds right after the hand-over. A
    client whose ZooKeeper watch has not yet shown the new owner (delayed here by 0.25 s)
    waits for it instead of mounting at the server that just suspended its feed (a
    round trip to be refused, under load tens of milliseconds of a rolling restart's
    gap). Its appends go on committing at the new owner."""
    cluster, index = two_servers(make_cluster, 2)
    old_endpoint = f":{cluster.servers[index].ready['port']}"
    real = ClusterView._post

    def late(view: ClusterView, fn, *args) -> None:  # ZooKeeper's watches arrive late
        loop = view._loop
        assert loop is not None
        real(view, loop.call_later, 0.25, fn, *args)

    monkeypatch.setattr(ClusterView, "_post", late)
    # However busy the machine, the client waits for the late view rather than give up.
    monkeypatch.setattr(partition_driver, "MAX_OWNER_WAIT", 60.0)
    caplog.set_level(logging.INFO, logger="waltz_client.client")
    config = WaltzClientConfig(
        cluster.zookeeper_connect, zk_root=cluster.layout.root, feed=False, max_retries=100
    )
    committed_after: list[int] = []

    async def scenario() -> None:
        async with WaltzClient(config) as client:
            assert (await client.submit(Put(b"before", 0))).status == SubmitStatus.COMMITTED
            await asyncio.to_thread(cluster.servers[index].stop)
            for i in range(5):
                result = await client.submit(Put(b"after-%d" % i, 0))
                assert result.status == SubmitStatus.COMMITTED
                committed_after.append(result.transaction_id)

    asyncio.run(scenario())
    lines = [r.getMessage() for r in caplog.records if r.name == "waltz_client.client"]
    suspended = [i for i, line in enumerate(lines) if "partition 0: feed suspended" in line]
    assert suspended, lines
    after = lines[suspended[0] :]
    asked_old = [
        line for line in after if line.startswith("partition 0: mount") and old_endpoint in line
    ]
    assert not asked_old, after
    assert len(committed_after) == 5
