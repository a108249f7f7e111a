"""Replica-set changes on a running cluster never wedge a partition.

The issue's example, with real processes: a partition of replicas {A, B, C} gets a
fourth replica D while D's storage node is down, so its next session counts its quorum
over {A, B, C, D} with members {A, B, C}. Removing A then is refused (B and C alone are
not a majority of four). Once D has joined a session, removing A is allowed; A's storage
node keeps serving the partition until a session that no longer counts it has
recovered, then lets it go; the partition keeps committing throughout.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest
from server_harness import PartitionClient, cluster_admin, partition_metadata, wait_for

from waltz_client.cluster.admin import assign_partitions, read_assignment, unassign_partitions
from waltz_client.cluster.errors import ClusterError
from waltz_client.cluster.metadata import UNRESOLVED

pytestmark = pytest.mark.timeout(300)


def _members(cluster) -> set[str]:
    meta = partition_metadata(cluster, 0)
    writer = max(r.session_id for r in meta.replicas.values())
    return {
        a
        for a, r in meta.replicas.items()
        if r.session_id == writer and r.closing_high_water_mark == UNRESOLVED
    }


def _served_partitions(cluster, index: int) -> list[int]:
    url = f"http://127.0.0.1:{cluster.storages[index].ready['http_port']}/readyz"
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return json.loads(r.read())["partitions"]
    except urllib.error.HTTPError as e:
        return json.loads(e.read())["partitions"]


def _applied(cluster, index: int) -> bool:
    """Whether the storage node has applied the partition's removal (kept it for a vote,
    or closed it)."""
    with open(cluster.storages[index].log_path) as f:
        log = f.read()
    return "no longer assigned here" in log or "closed 0" in log


def _roles(cluster) -> tuple[list[str], str, str, dict[str, int]]:
    """Partition 0's replicas, A (the first of them), D (the fourth storage node) and the
    index of each storage node."""
    holders = cluster_admin(cluster, read_assignment)[0].replicas_of(0)
    addresses = cluster.layout.storage_addresses
    (d,) = [x for x in addresses if x not in holders]
    return holders, holders[0], d, {address: i for i, address in enumerate(addresses)}


async def _a_new_reader_sees_the_same_log(cluster, client: PartitionClient) -> None:
    reader = PartitionClient(cluster, 0)
    await reader.mount()
    await reader.wait_feed(client.high_water_mark)
    assert reader.feed == client.feed
    await client.close()
    await reader.close()


async def _write(client: PartitionClient, n: int, tag: bytes) -> int:
    for i in range(n):
        client.append(tag + b"-%d" % i)
    return await client.flush(timeout=120)


def test_removing_a_member_waits_for_the_new_replica_then_never_wedges(make_cluster):
    cluster = make_cluster(storages=4)
    holders, a, d, index = _roles(cluster)

    async def scenario() -> None:
        client = PartitionClient(cluster, 0)
        await client.mount()
        assert await _write(client, 50, b"first") == 49

        cluster.storages[index[d]].stop()
        cluster_admin(cluster, assign_partitions, d, {0})
        # The server runs a session over {A, B, C, D} without D.
        await asyncio.to_thread(
            wait_for,
            lambda: (
                set(partition_metadata(cluster, 0).replicas) == {*holders, d}
                and _members(cluster) == set(holders)
            ),
            60,
            "a session over four replicas with three members",
        )
        client.suspended.clear()
        await client.mount()
        hwm = await _write(client, 50, b"second")

        with pytest.raises(ClusterError, match=r"only 2 of its members would remain"):
            cluster_admin(cluster, unassign_partitions, a, {0})
        assert a in cluster_admin(cluster, read_assignment)[0].replicas_of(0)

        cluster.storages[index[d]].start()
        await asyncio.to_thread(
            wait_for, lambda: d in _members(cluster), 120, "D to join a session"
        )
        cluster_admin(cluster, unassign_partitions, a, {0})
        # A keeps the partition while a session may still count its vote, then lets go.
        await asyncio.to_thread(
            wait_for,
            lambda: 0 not in _served_partitions(cluster, index[a]),
            120,
            "A's storage node to close the partition",
        )
        assert a not in partition_metadata(cluster, 0).replicas
        with open(cluster.storages[index[a]].log_path) as f:
            assert "counts this node's vote: serving it until" in f.read()
        client.suspended.clear()
        await client.mount()
        assert await _write(client, 50, b"third") >= hwm + 50
        await _a_new_reader_sees_the_same_log(cluster, client)

    asyncio.run(scenario())


@pytest.mark.parametrize("restart_a", [False, True], ids=["running", "restarted"])
def test_a_removed_member_still_votes_when_the_remaining_ones_disagree(make_cluster, restart_a):
    """Four replicas, all members. D stops answering, and transactions commit on A, B and
    C. A is removed: B and C hold those transactions, D (a member, paused) may not, so
    without A's vote they are undecidable, for good once D is back without them. A's
    storage node keeps serving the partition for that vote, also when it restarts after
    the change and before the vote (a rolling restart: it opens the partition again from
    its disk); the partition recovers."""
    cluster = make_cluster(storages=4)
    _, a, d, index = _roles(cluster)
    addresses = cluster.layout.storage_addresses

    async def scenario() -> None:
        client = PartitionClient(cluster, 0)
        await client.mount()
        await _write(client, 20, b"first")
        cluster_admin(cluster, assign_partitions, d, {0})
        await asyncio.to_thread(
            wait_for, lambda: _members(cluster) == set(addresses), 120, "four members"
        )
        client.suspended.clear()
        await client.mount()
        cluster.storages[index[d]].pause()
        try:
            hwm = await _write(client, 20, b"without-d")  # on A, B and C only
            # The owner notices the change only after A's storage node has applied it.
            cluster.servers[0].pause()
            try:
                cluster_admin(cluster, unassign_partitions, a, {0})  # B, C, D: 3 of 4
                await asyncio.to_thread(
                    wait_for, lambda: _applied(cluster, index[a]), 30, "A to see the change"
                )
                if restart_a:
                    cluster.storages[index[a]].stop()
                    cluster.storages[index[a]].start()
                    assert 0 in _served_partitions(cluster, index[a]), "A did not reopen it"
            finally:
                cluster.servers[0].resume()
            client.suspended.clear()
            await client.mount()  # recovery needs A's vote: D is paused
            assert await _write(client, 20, b"after") == hwm + 20
            assert a not in partition_metadata(cluster, 0).replicas
        finally:
            cluster.storages[index[d]].resume()
        await asyncio.to_thread(
            wait_for, lambda: 0 not in _served_partitions(cluster, index[a]), 60, "A lets go"
        )
        await _a_new_reader_sees_the_same_log(cluster, client)

    asyncio.run(scenario())
