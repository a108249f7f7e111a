"""An upgrade of a running cluster from the release before commit times, in the documented
order (docs/operations.md, Upgrading): storage nodes one at a time, then the server, then
clients; writes go on at every step.

The old release's daemons are the real ones: its source, taken from this repository's
history (``git archive``), run from a directory of their own (its pure-Python loops: its
compiled module is not built there). Then every transaction written before the upgrade
reads back without a commit time, every one after with a time that never goes back, the
old format-1 segments stay on the nodes beside new format-2 ones, and Find Time starts at
the first transaction with a time.
"""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest
from server_harness import owner_of, write_each

from waltz_client import WaltzClient, WaltzClientConfig
from waltz_client.tools.demo.common import FAST_FAILOVER
from waltz_client.tools.local.cluster import LocalCluster
from waltz_client.wire.records import NO_TIMESTAMP
from waltz_client.wire.storage_client import StorageClient

# The last commit before commit times (records of format 1, storage and client protocol 2).
OLD_RELEASE = "48167d43b76238d473fe77e5c19ef4b11f8a84da"
REPOSITORY = Path(__file__).resolve().parents[2]
SEGMENT_VERSION = 0  # offset of the format version in a segment header (i32)


def old_release(into: Path) -> Path:
    """The old release's source tree, or skip (not a git checkout with that history)."""
    if not (REPOSITORY / ".git").exists():
        pytest.skip("not a git checkout: the old release comes from the repository's history")
    archive = subprocess.run(
        ["git", "-C", str(REPOSITORY), "archive", "--format=tar", OLD_RELEASE],
        capture_output=True,
    )
    if archive.returncode != 0:
        pytest.skip(f"the old release {OLD_RELEASE[:12]} is not in this clone's history")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into


def old_env(tree: Path) -> dict[str, str]:
    """Run a daemon from the old tree: its packages first on the path, and not this
    checkout's from the working directory (``python -m`` would put it first)."""
    path = os.pathsep.join(str(tree / d) for d in ("", "images/server", "images/storage"))
    return {**os.environ, "PYTHONPATH": path, "PYTHONSAFEPATH": "1"}


def storage_version(cluster: LocalCluster, i: int) -> int:
    async def ask() -> int:
        host, port = cluster.layout.storage_addresses[i].rsplit(":", 1)
        client = await StorageClient.connect(host, int(port))
        await client.close()
        return client.version

    return asyncio.run(ask())


def read_times(cluster: LocalCluster, cap: int | None = None) -> list[tuple[int, bytes, int]]:
    async def read() -> list[tuple[int, bytes, int]]:
        config = WaltzClientConfig(cluster.zookeeper_connect, zk_root=cluster.layout.root)
        if cap is not None:
            config = replace(config, _max_protocol_version=cap)
        async with WaltzClient(replace(config, feed=False)) as client:
            return [(r.transaction_id, r.data, r.timestamp) async for r in client.read(0)]

    return asyncio.run(read())


def find_time(cluster: LocalCluster, time_ms: int) -> int:
    async def ask() -> int:
        config = WaltzClientConfig(
            cluster.zookeeper_connect, zk_root=cluster.layout.root, feed=False
        )
        async with WaltzClient(config) as client:
            return await client.find_time(0, time_ms)

    return asyncio.run(ask())


def segment_versions(directory: str) -> list[int]:
    versions = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".seg"):
            with open(os.path.join(directory, name), "rb") as f:
                versions.append(int.from_bytes(f.read(4), "big", signed=True))
    return versions


def test_a_rolling_upgrade_keeps_every_transaction_and_adds_commit_times(
    zookeeper, zk_root, tmp_path
) -> None:
    tree = old_release(tmp_path / "old")
    cluster = LocalCluster(
        str(tmp_path / "cluster"),
        storages=3,
        partitions=1,
        replicas=3,
        root=zk_root,
        servers=1,
        server_args=list(FAST_FAILOVER),
        external_zookeeper=zookeeper.connect_string,
    )
    for daemon in [*cluster.storages, *cluster.servers]:
        daemon.env = old_env(tree)
    cluster.start()
    try:
        assert [storage_version(cluster, i) for i in range(3)] == [2, 2, 2]  # the old build
        asyncio.run(write_each(cluster, range(1), 30, b"old"))

        # Storage nodes first, one at a time; the old server writes on through each step.
        for i, storage in enumerate(cluster.storages):
            storage.stop()
            storage.env = None
            storage.start()
            assert storage_version(cluster, i) == 3
            asyncio.run(write_each(cluster, range(1), 10, b"mixed-%d" % i))

        # Then the server.
        server = cluster.servers[0]
        server.stop()
        server.env = None
        server.start()
        owner_of(cluster, 0)
        asyncio.run(write_each(cluster, range(1), 30, b"new"))

        records = read_times(cluster)
        assert len(records) == 90
        assert [txid for txid, _, _ in records] == list(range(90))
        before, after = records[:60], records[60:]
        assert all(t == NO_TIMESTAMP for _, _, t in before), "an old transaction got a time"
        times = [t for _, _, t in after]
        assert all(t != NO_TIMESTAMP for t in times)
        assert times == sorted(times)
        assert find_time(cluster, times[0]) == 60
        assert find_time(cluster, 0) == 60  # the old ones count as earlier than any time
        # A client of the old protocol reads it all, without times.
        assert [(txid, data) for txid, data, _ in read_times(cluster, cap=2)] == [
            (txid, data) for txid, data, _ in records
        ]

        # Each node kept its old segment as it was and wrote new ones beside it.
        cluster.stop()
        for i in range(3):
            versions = segment_versions(os.path.join(cluster.data_dir, f"storage-{i}", "0"))
            assert versions[0] == 1 and versions[-1] == 2, versions
    finally:
        cluster.stop()
