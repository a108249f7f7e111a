"""One storage node's disk fills under load: the partition's next session leaves that
replica out (it cannot be copied up to date) and goes on committing on the other two;
once space is freed, the replica comes back and is caught up, without restarting
anything. Its disk is a real tmpfs (needs root to mount;
skipped otherwise)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest
from server_harness import Put, wait_for

from waltz_client import WaltzClient, WaltzClientConfig

pytestmark = pytest.mark.timeout(300)


def http(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def stored_max(cluster, storage: int) -> int:
    _, text = http(cluster.storages[storage].ready["http_port"], "/metrics")
    for line in text.splitlines():
        if line.startswith('waltz_storage_partition_max_transaction_id{partition="0"}'):
            return int(float(line.split()[-1]))
    raise AssertionError("no max_transaction_id")


@pytest.fixture
def small_disk_cluster(make_cluster, tmp_path: Path):
    cluster = make_cluster(partitions=1)
    directory = Path(cluster.data_dir) / "storage-0"
    cluster.storages[0].stop()
    saved = tmp_path / "saved"
    shutil.copytree(directory, saved)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(directory)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        cluster.storages[0].start()
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip() or 'not root'}")
    try:
        shutil.copytree(saved, directory, dirs_exist_ok=True)
        stat = os.statvfs(directory)
        filler = directory / "filler"
        filler.write_bytes(b"\0" * (stat.f_bavail * stat.f_frsize - 400 * 1024))
        cluster.storages[0].start()
        yield cluster, filler
    finally:
        cluster.stop()
        subprocess.run(["umount", "-l", str(directory)], check=False)


def test_a_full_replica_is_left_out_and_comes_back_when_space_is_freed(small_disk_cluster):
    cluster, filler = small_disk_cluster
    config = WaltzClientConfig(cluster.zookeeper_connect, zk_root=cluster.layout.root, feed=False)

    async def load(first: int, count: int) -> None:
        async with WaltzClient(config) as client:
            for start in range(first, first + count, 50):
                puts = [
                    client.submit(Put(bytes([i % 256]) * 4096)) for i in range(start, start + 50)
                ]
                assert all(r.committed for r in await asyncio.gather(*puts))

    def server_metric(name: str) -> int:
        _, text = http(cluster.servers[0].ready["http_port"], "/metrics")
        for line in text.splitlines():
            if line.startswith(f'waltz_server_partition_{name}{{partition="0"}}'):
                return int(float(line.split()[-1]))
        return 0

    def live_replicas() -> int:
        return server_metric("live_replicas")

    wait_for(lambda: live_replicas() == 3, timeout=60, what="storage-0 back in the session")
    # ~2 MB of appends: storage-0 runs out of space a quarter of the way in.
    asyncio.run(load(0, 500))
    status, body = http(cluster.storages[0].ready["http_port"], "/readyz")
    assert status == 503 and "no space" in json.loads(body)["unavailable_partitions"]["0"]
    assert stored_max(cluster, 0) < 400
    assert stored_max(cluster, 1) == stored_max(cluster, 2) == 499
    # The recovery that followed left it out: it could not be copied up to date.
    server_log = Path(cluster.servers[0].log_path).read_text()
    assert "no space for an append" in server_log

    filler.unlink()
    wait_for(lambda: stored_max(cluster, 0) == 499, timeout=120, what="storage-0 to catch up")
    asyncio.run(load(500, 100))
    wait_for(lambda: stored_max(cluster, 0) == 599, timeout=60, what="storage-0 to take appends")
    assert http(cluster.storages[0].ready["http_port"], "/readyz")[0] == 200
