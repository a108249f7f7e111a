"""Servers follow the cluster's partitions as they grow: the assigner places the new
partitions among the live servers, and the old ones stay where they are."""

from __future__ import annotations

import time

import pytest

from waltz_client.cluster import admin
from waltz_client.cluster.zk import close

pytestmark = pytest.mark.timeout(240)


def test_the_servers_take_the_new_partitions_and_keep_the_old(make_cluster):
    cluster = make_cluster(partitions=2, servers=2)
    zk = cluster.zk_connect()
    try:
        before = admin.read_cluster(zk, cluster.layout.root).ownership.partitions
        assert all(owner is not None for owner, _ in before.values())
        admin.add_partitions(zk, cluster.layout.root, 6)
        deadline = time.monotonic() + 60
        while True:
            owners = admin.read_cluster(zk, cluster.layout.root).ownership.partitions
            if len(owners) == 6 and all(owner is not None for owner, _ in owners.values()):
                break
            assert time.monotonic() < deadline, f"new partitions still unowned: {owners}"
            time.sleep(0.1)
        assert {p: owners[p] for p in (0, 1)} == before  # no move, no new generation
        servers = sorted({owner for owner, _ in owners.values()})
        assert len(servers) == 2
        assert sorted(sum(1 for o, _ in owners.values() if o == s) for s in servers) == [3, 3]
    finally:
        close(zk)
