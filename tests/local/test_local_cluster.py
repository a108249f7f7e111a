"""The local cluster: embedded ZooKeeper, storage processes following ZooKeeper, CreateCluster."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

from waltz_client.cluster.admin import assign_partitions, read_params, unassign_partitions
from waltz_client.cluster.zk import close, connect
from waltz_client.tools.local.cluster import LocalCluster, LocalClusterError
from waltz_client.wire.records import Record, ReqId
from waltz_client.wire.storage_client import StorageClient, StorageFailure
from waltz_client.wire.storage_messages import StorageError

pytestmark = pytest.mark.timeout(120)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie still answers kill(0); it is gone if its state is Z or it was reaped.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] == "Z"
    except FileNotFoundError:
        return True


async def _probe(
    port: int, key: uuid.UUID, partitions: int, partition: int, append: list[Record] | None = None
) -> int:
    """Max transaction ID of ``partition`` on the storage node at ``port`` (appending first).

    In no session (-1): with no server, ZooKeeper records none, and a storage node adopts
    only a session the metadata records."""
    async with await StorageClient.connect("127.0.0.1", port) as client:
        await client.open(key, partitions)
        if append:
            await client.append(-1, partition, append)
        return await client.max_transaction_id(-1, partition)


def _key(cluster: LocalCluster) -> uuid.UUID:
    zk = connect(cluster.zookeeper_connect)
    try:
        return read_params(zk, cluster.layout.root).key
    finally:
        close(zk)


def test_local_cluster_starts_serves_restarts_and_stops_cleanly(tmp_path, zookeeper_available):
    """Storage-level checks write with their own session, so no server runs here; the
    servers of a local cluster are exercised by tests/server."""
    data = tmp_path / "cluster"
    cluster = LocalCluster(str(data), storages=3, partitions=2, replicas=3, servers=0)
    cluster.start()
    try:
        assert cluster.created is not None and cluster.created.created
        key = _key(cluster)
        records = [Record(i, ReqId(1, 1, 0, i), i, f"tx{i}".encode()) for i in range(5)]
        for proc in cluster.storages:  # every node holds both partitions (3 of 3 replicas)
            assert asyncio.run(_probe(proc.ready["port"], key, 2, 1)) == -1
            assert asyncio.run(_probe(proc.ready["port"], key, 2, 0, records)) == 4
        pids = [p.pid for p in cluster.storages] + [cluster.zookeeper.pid]
        ports = [p.ready["port"] for p in cluster.storages]
    finally:
        cluster.stop()
    assert all(_gone(pid) for pid in pids)

    again = LocalCluster(str(data), storages=3, partitions=2, replicas=3, servers=0)
    again.start()
    try:
        assert again.created is not None and not again.created.created
        assert [p.ready["port"] for p in again.storages] == ports
        assert _key(again) == key
        for proc in again.storages:  # the data survived the restart
            assert asyncio.run(_probe(proc.ready["port"], key, 2, 0)) == 4
    finally:
        again.stop()

    with pytest.raises(LocalClusterError, match="partitions"):
        LocalCluster(str(data), storages=3, partitions=5, replicas=3)


def test_storage_node_follows_assignment_changes_while_running(tmp_path, zookeeper_available):
    cluster = LocalCluster(str(tmp_path / "c"), storages=2, partitions=4, replicas=1, servers=0)
    cluster.start()
    try:
        key = _key(cluster)
        zk = connect(cluster.zookeeper_connect)
        try:
            node = cluster.storages[0]
            address = f"127.0.0.1:{node.ready['port']}"
            held = set(cluster.created.assignment.storages[address])
            missing = min(set(range(4)) - held)

            def status() -> StorageError | None:
                try:
                    asyncio.run(_probe(node.ready["port"], key, 4, missing))
                    return None
                except StorageFailure as e:
                    return e.error

            assert status() is StorageError.PARTITION_NOT_FOUND
            assign_partitions(zk, cluster.layout.root, address, {missing})
            deadline = time.monotonic() + 10
            while status() is not None:
                assert time.monotonic() < deadline, "the new partition was never opened"
                time.sleep(0.1)
            assert os.path.isdir(tmp_path / "c" / "storage-0" / str(missing))

            unassign_partitions(zk, cluster.layout.root, address, {missing})
            deadline = time.monotonic() + 10
            while status() is not StorageError.PARTITION_NOT_FOUND:
                assert time.monotonic() < deadline, "the partition was never closed"
                time.sleep(0.1)
        finally:
            close(zk)
    finally:
        cluster.stop()


def test_waltz_local_up_serves_until_interrupted_and_leaves_nothing_behind(
    tmp_path, zookeeper_available
):
    data = tmp_path / "up"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "waltz_client.tools.cli",
            "local",
            "up",
            "--data-dir",
            str(data),
            "--storages",
            "2",
            "--replicas",
            "2",
            "--partitions",
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "ready." in line:
                break
        assert any("ready." in line for line in lines), "".join(lines)
        pids = [json.loads((data / f"storage-{i}.ready").read_text())["pid"] for i in range(2)]
        state = json.loads((data / "local.json").read_text())
        zk = connect(f"127.0.0.1:{state['zookeeper_port']}")
        try:
            assert read_params(zk, "/waltz").num_partitions == 2
        finally:
            close(zk)
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, "".join(lines) + rest
    assert "stopped" in rest
    assert all(_gone(pid) for pid in pids)
    with socket.socket() as s:  # ZooKeeper is gone too: nothing listens on its port
        assert s.connect_ex(("127.0.0.1", state["zookeeper_port"])) != 0


def test_waltz_local_up_refuses_a_data_dir_made_with_other_settings(tmp_path):
    (tmp_path / "local.json").write_text(
        json.dumps(
            {
                "name": "local",
                "root": "/waltz",
                "partitions": 4,
                "replicas": 3,
                "zookeeper_port": 1,
                "storage_ports": [[2, 3], [4, 5], [6, 7]],
            }
        )
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "waltz_client.tools.cli",
            "local",
            "up",
            "--data-dir",
            str(tmp_path),
            "--partitions",
            "8",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "waltz local: error:" in result.stderr and "8" in result.stderr
