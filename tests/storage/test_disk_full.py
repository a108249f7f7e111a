"""A storage node whose disk fills: appends fail cleanly (nothing half-written, nothing
acknowledged), /readyz and a metric say so, reads go on, and once space is freed the
next append succeeds without a restart. The disk is a real 4 MiB tmpfs (needs root to
mount; skipped otherwise)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_protocol import SESSION, run
from test_storage_bounds import records

from waltz_client.wire.storage_client import StorageFailure
from waltz_client.wire.storage_messages import StorageError

MiB = 1024 * 1024


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip() or 'not root'}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def gauge(node, name: str, partition: int) -> float:
    status, text = node.get("/metrics")
    assert status == 200
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == f"waltz_storage_partition_{name}" and s.labels == {
                "partition": str(partition)
            }:
                return s.value
    raise AssertionError(f"no {name} for partition {partition}")


def test_a_full_disk_fails_appends_cleanly_and_recovers_when_space_is_freed(
    storage_factory, small_disk: Path
):
    node = storage_factory(directory=small_disk / "data")
    filler = small_disk / "filler"
    free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
    filler.write_bytes(b"\0" * (free - 600 * 1024))  # about 600 KiB left

    sent: list = []

    async def fill() -> tuple[int, str]:
        async with await node.client() as c:
            txid = 0
            while True:
                batch = records(txid, 4, 16 * 1024)
                try:
                    await c.append(SESSION, 0, batch)
                except StorageFailure as e:
                    assert e.error == StorageError.IO_ERROR
                    return txid, str(e)
                sent.extend(batch)
                txid += 4

    acknowledged, message = run(fill())
    assert acknowledged > 0
    assert "no space" in message and "nothing was written" in message

    status, body = node.get("/readyz")
    assert status == 503, body
    assert "no space" in json.loads(body)["unavailable_partitions"]["0"]
    assert node.get("/healthz")[0] == 200  # no restart needed
    assert gauge(node, "out_of_space", 0) == 1
    assert gauge(node, "needs_restart", 0) == 0

    async def while_full() -> None:
        async with await node.client() as c:
            # Exactly the acknowledged records are there, readable; nothing of the
            # failed append.
            assert await c.max_transaction_id(SESSION, 0) == acknowledged - 1
            batch = await c.records(SESSION, 0, acknowledged - 4, 10)
            assert list(batch.records()) == sent[-4:]
            # Still full: the same append fails again, the same way.
            with pytest.raises(StorageFailure, match="no space"):
                await c.append(SESSION, 0, records(acknowledged, 4, 16 * 1024))

    run(while_full())

    filler.unlink()

    async def after_freeing() -> None:
        async with await node.client() as c:
            await c.append(SESSION, 0, records(acknowledged, 4, 16 * 1024))
            assert await c.max_transaction_id(SESSION, 0) == acknowledged + 3

    run(after_freeing())
    assert node.get("/readyz")[0] == 200
    assert gauge(node, "out_of_space", 0) == 0
    assert "appends fit on the disk again" in node.log()

    # Restarted, the node finds exactly what it acknowledged.
    assert node.stop() == 0
    node.start()

    async def after_restart() -> None:
        async with await node.client() as c:
            assert await c.max_transaction_id(SESSION, 0) == acknowledged + 3

    run(after_restart())
    node.stop()
