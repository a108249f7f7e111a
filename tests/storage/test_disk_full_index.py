"""A disk that fills between an append's records and its index entries.

The records of an append go into zeros written ahead of them, so they need no new
block; their index entries extend the ``.idx`` file, which needs one every 512 entries.
On a full disk the records are written and fdatasync'd, then the index write fails
(ENOSPC, often after a short write). That append was never acknowledged: the node
undoes it (the log on disk is again exactly the acknowledged records, with an index
that matches them), answers the retryable "no space" error, and serves on; once there
is room the next append succeeds, with no restart. The disk is a real 4 MiB tmpfs
(root only, like test_disk_full.py).
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

from test_disk_full import gauge, small_disk  # noqa: F401 (small_disk is a fixture)
from test_protocol import SESSION, run
from test_storage_bounds import records

from waltz_client.wire.storage_client import StorageFailure
from waltz_client.wire.storage_messages import StorageError
from waltz_storage.inspect import verify_segment
from waltz_storage.segment import HEADER_BYTES

BATCH = 20  # records an append; 496 entries fill the index's first 4 KiB block


def fill(path: Path) -> None:
    """Write ``path`` until the filesystem has no block left."""
    chunk = b"\xff" * 65536
    with open(path, "wb", buffering=0) as f:
        for size in (65536, 4096, 512, 1):
            while True:
                try:
                    if f.write(chunk[:size]) < size:
                        break
                except OSError as e:
                    assert e.errno == errno.ENOSPC
                    break


def test_an_index_write_on_a_full_disk_undoes_the_append_and_recovers_without_restart(
    storage_factory,
    small_disk: Path,  # noqa: F811
) -> None:
    data = small_disk / "data"
    node = storage_factory(directory=data, num_partitions=1, partitions="0")
    segment = str(data / "0" / "0000000000000000000.seg")
    block = os.statvfs(small_disk).f_bsize
    # The first append whose index entries reach into the index file's second block.
    first_refused = (block - HEADER_BYTES) // 8 // BATCH * BATCH
    sent: list = []

    async def append_until_refused(first: int, last: int) -> tuple[int, StorageFailure | None]:
        async with await node.client() as c:
            for txid in range(first, last, BATCH):
                batch = records(txid, BATCH, 100)
                try:
                    await c.append(SESSION, 0, batch)
                except StorageFailure as e:
                    return txid, e
                sent.extend(batch)
        return last, None

    # 400 records: their index entries fit in its first block, and the segment has
    # zeros written ahead of its records for 1-2 MiB more.
    assert run(append_until_refused(0, 400)) == (400, None)
    filler = small_disk / "filler"
    fill(filler)
    assert os.statvfs(small_disk).f_bfree == 0

    acknowledged, refusal = run(append_until_refused(400, 2000))
    assert refusal is not None
    assert acknowledged == first_refused, "the records, written into zeros, never failed"
    assert refusal.error == StorageError.IO_ERROR
    message = str(refusal)
    assert "no space" in message and "writing the index" in message, message
    assert "nothing was written" in message and "resume by themselves" in message

    # Not a failed fsync: live (no restart wanted), unready, out of space.
    status, body = node.get("/healthz")
    assert status == 200, body
    status, body = node.get("/readyz")
    assert status == 503 and "no space" in json.loads(body)["unavailable_partitions"]["0"]
    assert gauge(node, "out_of_space", 0) == 1
    assert gauge(node, "needs_restart", 0) == 0
    assert "fsync failed" not in node.log()

    # The refused append was undone: the files hold exactly the acknowledged records,
    # with one index entry each, and they read back.
    report = verify_segment(segment)
    assert report.ok, report.problems
    assert (report.records, report.index_entries) == (acknowledged, acknowledged)

    async def while_out_of_space() -> None:
        async with await node.client() as c:
            assert await c.max_transaction_id(SESSION, 0) == acknowledged - 1
            batch = await c.records(SESSION, 0, acknowledged - BATCH, BATCH)
            assert list(batch.records()) == sent[-BATCH:]

    run(while_out_of_space())

    filler.unlink()
    # Room again: appends go on, across the index's next blocks, and the node is ready.
    assert run(append_until_refused(acknowledged, 1200)) == (1200, None)
    assert node.get("/readyz")[0] == 200
    assert node.get("/healthz")[0] == 200
    assert gauge(node, "out_of_space", 0) == 0
    assert "appends fit on the disk again" in node.log()

    # Restarted, the node opens the log cleanly: every acknowledged record, nothing else.
    assert node.stop() == 0
    logged = len(node.log())
    node.start()

    async def after_restart() -> list:
        async with await node.client() as c:
            assert await c.max_transaction_id(SESSION, 0) == 1199
            out: list = []
            while len(out) < 1200:
                out.extend((await c.records(SESSION, 0, len(out), 500)).records())
            return out

    assert run(after_restart()) == sent
    reopened = node.log()[logged:]
    assert "torn tail" not in reopened and "rebuilding" not in reopened, reopened
    report = verify_segment(segment)
    assert report.ok, report.problems
    assert (report.records, report.index_entries) == (1200, 1200)
    node.stop()


def test_a_segment_roll_on_a_full_disk_leaves_no_half_made_segment(
    storage_factory,
    small_disk: Path,  # noqa: F811
) -> None:
    """The append that starts a new segment finds no block for its files' headers: it
    is refused like any append that finds no room, and leaves no file behind."""
    data = small_disk / "data"
    node = storage_factory(
        directory=data, num_partitions=1, partitions="0", extra=["--segment-bytes", "65536"]
    )
    # 511 records of 128 bytes on disk (80 data bytes, format 2) fill the first segment's
    # 64 KiB exactly.
    batches = [records(txid, 73, 80) for txid in range(0, 511, 73)]
    sent = [r for batch in batches for r in batch]

    async def append(batch: list) -> None:
        async with await node.client() as c:
            await c.append(SESSION, 0, batch)

    for batch in batches:
        run(append(batch))
    before = sorted(os.listdir(data / "0"))
    filler = small_disk / "filler"
    fill(filler)

    for _ in range(2):  # still full: the same again
        try:
            run(append(records(511, 10, 80)))
        except StorageFailure as e:
            refusal = e
        else:
            raise AssertionError("an append that starts a segment on a full disk succeeded")
        assert sorted(os.listdir(data / "0")) == before
        assert refusal.error == StorageError.IO_ERROR
        assert "no space" in str(refusal) and "creating" in str(refusal), str(refusal)
    assert node.get("/healthz")[0] == 200
    assert gauge(node, "out_of_space", 0) == 1

    filler.unlink()
    later = records(511, 10, 80)
    run(append(later))
    assert gauge(node, "out_of_space", 0) == 0
    assert node.stop() == 0
    node.start()

    async def read_back() -> list:
        async with await node.client() as c:
            out: list = []
            while len(out) < 521:
                out.extend((await c.records(SESSION, 0, len(out), 600)).records())
            return out

    assert run(read_back()) == sent + later
    for name in ("0000000000000000000.seg", "0000000000000000511.seg"):
        assert verify_segment(str(data / "0" / name)).ok
    node.stop()
