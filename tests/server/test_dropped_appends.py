"""Appends a lost store session dropped are settled within about a second of the
partition's recovery, not after the client's request_timeout: a writer whose appends were
in flight when a replica paused waited 30 s before it retried them, though its partition
had recovered without the replica within seconds."""

from __future__ import annotations

import pytest
from server_harness import longest_gap_while_paused

from waltz_client import WaltzClientConfig

pytestmark = pytest.mark.timeout(300)


def test_a_paused_replica_holds_a_writer_no_longer_than_the_recovery(make_cluster):
    cluster = make_cluster(partitions=1, server_args=["--storage-timeout", "2"])
    config = WaltzClientConfig(cluster.zookeeper_connect, zk_root=cluster.layout.root, feed=False)

    gap = longest_gap_while_paused(cluster, config, b"x" * 1000, 64, settled_after=15)
    # Expected: the session leaves the replica within storage_timeout (2 s), recovery
    # gives up dialling it after another 2 s, and a flush settles the dropped appends a
    # second later. The client's request_timeout (30 s) was the old wait.
    assert gap < 20, f"no commit for {gap:.1f} s"
