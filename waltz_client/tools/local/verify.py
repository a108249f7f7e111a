"""Checks on a local cluster's replicas, over the storage protocol (no file access)."""

from __future__ import annotations

import asyncio
import hashlib

from waltz_client.cluster.admin import read_cluster
from waltz_client.cluster.zk import close
from waltz_client.wire.storage_client import StorageClient, StorageFailure

from .cluster import LocalCluster


async def replica_digests(cluster: LocalCluster, partition: int, high_water_mark: int) -> list[str]:
    """SHA-256 (16 hex digits) of each storage node's records ``0..high_water_mark`` of the
    partition, or ``"incomplete"`` for a node that lacks some. Reads with the partition's
    current store session, so it fences nothing; run it with the cluster quiet."""
    zk = cluster.zk_connect()
    try:
        state = read_cluster(zk, cluster.layout.root)
    finally:
        close(zk)
    session = state.partitions[partition].session_id
    params = state.params
    assert params is not None
    digests = []
    for proc in cluster.storages:
        digest = hashlib.sha256()
        next_txid = 0
        try:
            async with await StorageClient.connect(
                "127.0.0.1", proc.ready["port"], open_connection=cluster.storage_open_connection()
            ) as sc:
                await sc.open(params.key, params.num_partitions)
                while next_txid <= high_water_mark:
                    count = high_water_mark - next_txid + 1
                    batch = await sc.records(session, partition, next_txid, count)
                    if not len(batch):
                        break
                    digest.update(batch.buf)
                    next_txid = batch.last_txid + 1
        except (StorageFailure, ConnectionError, OSError, TimeoutError):
            next_txid = -1  # a new session started (fenced), or the node is down: not now
        digests.append(digest.hexdigest()[:16] if next_txid > high_water_mark else "incomplete")
    return digests


async def converged_digests(
    cluster: LocalCluster, high_water_marks: dict[int, int], timeout: float = 60.0
) -> dict[int, list[str]]:
    """Per partition, the replica digests once they agree (a replica that was down
    catches up in the next store session), or as they are when ``timeout`` runs out."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        digests = {
            p: await replica_digests(cluster, p, hwm)
            for p, hwm in sorted(high_water_marks.items())
            if hwm >= 0
        }
        agreed = all(len(set(d)) == 1 and "incomplete" not in d for d in digests.values())
        if agreed or loop.time() > deadline:
            return digests
        await asyncio.sleep(1.0)
