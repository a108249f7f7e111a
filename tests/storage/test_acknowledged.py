"""A damaged replica never rejoins below what it acknowledged.

A stopped node holds 2,500 committed records in partition 0 (local low-water
mark 2499) and a few in partition 1. Its files are damaged the way a bad disk
or a careless operator would (a deleted segment, a cut header, a flipped bit,
a zeroed page, a cut tail with the index emptied), then a real ``waltz-storage``
process is started on them. Partition 0 must be refused, naming the end of the
log it recovered and the local low-water mark, in ``/readyz``, the metrics,
every request and ``waltz storage verify``, without a byte of its files
changed; partition 1 keeps serving. The repair (move the partition directory
aside and restart) brings it back empty, fenced as before, for the server to
copy back. A torn tail above the low-water mark is still cut.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import struct
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
from prometheus_client.parser import text_string_to_metric_families

from waltz_client.wire.records import Record, RecordBatch, ReqId
from waltz_client.wire.storage_client import StorageFailure
from waltz_client.wire.storage_messages import (
    AppendRequest,
    SetLowWaterMarkRequest,
    StorageError,
    SuccessResponse,
)
from waltz_storage.service import EngineSettings, StorageNode

T = TypeVar("T")
KEY = uuid.UUID("ac4e0000-1111-4222-8333-444455556666")
SESSION = 9
COUNT = 2500
FLOOR = COUNT - 1  # the local low-water mark partition 0 is written with
LOW_FLOOR = 1000  # partition 2 holds the same records with this local low-water mark
HEADER_BYTES = 128
HEAD_BYTES = 44  # a record's head in segment format 2 (with the commit time)
OVERHEAD = 48
DATA_BYTES = 200
SEG = "0000000000000000000.seg"
IDX = "0000000000000000000.idx"


def run(coro: Awaitable[T], timeout: float = 60.0) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


def records(partition: int, n: int) -> list[Record]:
    rng = random.Random(f"acknowledged:{partition}")
    return [Record(t, ReqId(3, 1, partition, t), t, rng.randbytes(DATA_BYTES)) for t in range(n)]


def offset_of(txid: int) -> int:
    """Every record here is the same size: its offset in segment 0 follows from its ID."""
    return HEADER_BYTES + txid * (OVERHEAD + DATA_BYTES)


def write_node(directory: Path, segment_bytes: int) -> None:
    """Write the records through the storage engine, as a server would, then close it."""
    settings = EngineSettings(segment_bytes=segment_bytes)
    node = StorageNode.open(str(directory), KEY, 4, {0, 1, 2, 3}, settings)
    try:
        seq = 0
        for p, n, floor in ((0, COUNT, FLOOR), (1, 20, 19), (2, COUNT, LOW_FLOOR)):
            recs = records(p, n)
            for i in range(0, n, 100):
                seq += 1
                batch = RecordBatch.from_records(recs[i : i + 100])
                (response,) = node.partitions[p].process([AppendRequest(SESSION, seq, p, batch)])
                assert isinstance(response, SuccessResponse), response
            # What the next store session does once it has caught this replica up.
            seq += 1
            request = SetLowWaterMarkRequest(SESSION, seq, p, floor)
            assert node.partitions[p].process([request]) == [SuccessResponse(SESSION, seq, p)]
            assert node.partitions[p].info.local_low_water_mark == floor
    finally:
        node.close()


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two stopped nodes' directories: one segment per partition, and many small ones."""
    base = tmp_path_factory.mktemp("golden")
    out = {"one segment": base / "one", "many segments": base / "many"}
    write_node(out["one segment"], 1 << 30)
    write_node(out["many segments"], 64 * 1024)
    assert len(list((out["many segments"] / "0").glob("*.seg"))) > 5
    return out


def flip_bit(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x04
    path.write_bytes(bytes(data))


def segment_firsts(part: Path) -> list[int]:
    return sorted(int(p.stem) for p in part.glob("*.seg"))


# Each damage: (layout, what it does to partition directory ``part``) -> the transaction
# the recovered log ends at.
def delete_only_segment(part: Path) -> int:
    (part / SEG).unlink()
    return -1


def delete_first_segment(part: Path) -> int:
    (part / SEG).unlink()
    return -1


def delete_middle_segment(part: Path) -> int:
    firsts = segment_firsts(part)
    victim = firsts[len(firsts) // 2]
    (part / f"{victim:019d}.seg").unlink()
    return victim - 1


def empty_the_directory(part: Path) -> int:
    for path in part.iterdir():
        path.unlink()
    return -1


def cut_inside_header(part: Path) -> int:
    with open(part / SEG, "r+b") as f:
        f.truncate(60)
    return -1


def flip_bit_mid_segment_index_emptied(part: Path) -> int:
    flip_bit(part / SEG, offset_of(1250) + HEAD_BYTES + 17)
    (part / IDX).write_bytes(b"")
    return 1249


def cut_ten_bytes_index_emptied(part: Path) -> int:
    seg = part / SEG
    with open(seg, "r+b") as f:
        f.truncate(seg.stat().st_size - 10)
    (part / IDX).write_bytes(b"")
    return COUNT - 2


def flip_bit_mid_segment(part: Path) -> int:
    flip_bit(part / SEG, offset_of(1250) + HEAD_BYTES + 17)
    return 1249


def zero_page_mid_segment(part: Path) -> int:
    page = (offset_of(1250) // 4096 + 1) * 4096  # starts inside a record
    victim = (page - HEADER_BYTES) // (OVERHEAD + DATA_BYTES)
    assert offset_of(victim) < page < offset_of(victim + 1)
    with open(part / SEG, "r+b") as f:
        f.seek(page)
        f.write(bytes(4096))
    return victim - 1


DAMAGE: dict[str, tuple[str, Callable[[Path], int]]] = {
    "deleted segment (the only one)": ("one segment", delete_only_segment),
    "deleted first segment": ("many segments", delete_first_segment),
    "deleted middle segment": ("many segments", delete_middle_segment),
    "emptied partition directory": ("one segment", empty_the_directory),
    "segment cut inside its header": ("one segment", cut_inside_header),
    "bit flip mid-segment, index emptied": ("one segment", flip_bit_mid_segment_index_emptied),
    "10-byte cut, index emptied": ("one segment", cut_ten_bytes_index_emptied),
    "bit flip mid-segment, index intact": ("one segment", flip_bit_mid_segment),
    "zeroed 4 KiB page mid-segment, index intact": ("one segment", zero_page_mid_segment),
}


def snapshot(part: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(part.iterdir())}


def scrape(node) -> dict[tuple[str, frozenset], float]:
    status, text = node.get("/metrics")
    assert status == 200
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def gauge(samples: dict, name: str, partition: int) -> float:
    return samples[(f"waltz_storage_partition_{name}", frozenset({("partition", str(partition))}))]


def start_on(storage_factory, directory: Path):
    return storage_factory(directory=directory, key=KEY, extra=["--log-level", "INFO"])


def assert_names_both(message: str, end: int, floor: int) -> None:
    assert f"ends at transaction {end}" in message, message
    assert f"local low-water mark {floor}" in message, message


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_log_damaged_below_the_low_water_mark_is_refused(
    golden, storage_factory, waltz, tmp_path: Path, case: str
) -> None:
    layout, damage = DAMAGE[case]
    data = tmp_path / "data"
    shutil.copytree(golden[layout], data)
    part = data / "0"
    end = damage(part)
    damaged = snapshot(part)

    node = start_on(storage_factory, data)
    status, body = node.get("/readyz")
    assert status == 503, body
    ready = json.loads(body)
    assert list(ready["unavailable_partitions"]) == ["0"], ready
    reason = ready["unavailable_partitions"]["0"]
    assert_names_both(reason, end, FLOOR)
    assert "move" in reason and str(part) in reason  # how to repair
    assert node.get("/healthz")[0] == 200  # a restart would not help: only unready

    samples = scrape(node)
    assert gauge(samples, "available", 0) == 0
    assert gauge(samples, "max_transaction_id", 0) == end
    assert gauge(samples, "local_low_water_mark", 0) == FLOOR
    assert gauge(samples, "available", 1) == 1

    async def requests() -> None:
        async with await node.client() as c:
            for call in (
                c.max_transaction_id(SESSION, 0),
                c.last_session_info(SESSION, 0),
                c.record(SESSION, 0, 0),
                c.append(SESSION, 0, [Record(end + 1, ReqId(1, 1, 0, 0), 0, b"x")]),
            ):
                with pytest.raises(StorageFailure) as info:
                    await call
                assert info.value.error == StorageError.PARTITION_UNAVAILABLE
                assert_names_both(info.value.message, end, FLOOR)
            assert await c.record(SESSION, 1, 7) == records(1, 20)[7]
            assert await c.max_transaction_id(SESSION, 2) == COUNT - 1

    run(requests())
    assert "refuses to open" in node.log()
    assert node.stop() == 0
    assert snapshot(part) == damaged, "a refused open changed the partition's files"

    for target in (data, part):
        result = waltz("storage", "verify", str(target))
        assert result.returncode == 1, result.stdout + result.stderr
        assert_names_both(result.stdout, end, FLOOR)
    result = waltz("storage", "verify", "--json", str(data))
    assert result.returncode == 1
    refused = [r for r in json.loads(result.stdout) if r.get("partition") == 0]
    assert len(refused) == 1 and not refused[0]["ok"], result.stdout
    assert (refused[0]["recovered_end"], refused[0]["local_low_water_mark"]) == (end, FLOOR)
    assert snapshot(part) == damaged


def test_moving_the_partition_aside_rebuilds_it_empty_and_still_fenced(
    golden, storage_factory, waltz, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    shutil.copytree(golden["one segment"], data)
    flip_bit_mid_segment(data / "0")
    node = start_on(storage_factory, data)
    assert node.get("/readyz")[0] == 503
    assert node.stop() == 0

    # The runbook: move the partition's directory aside, start the node again.
    shutil.move(data / "0", tmp_path / "partition-0-damaged")
    node.start()
    status, body = node.get("/readyz")
    assert status == 200, body
    assert "starting it empty" in node.log()

    async def rejoin() -> None:
        async with await node.client() as c:
            assert await c.max_transaction_id(SESSION, 0) == -1
            # A new replica to the server: no session, no low-water marks...
            info = await c.last_session_info(SESSION, 0)
            assert (info.last_session_id, info.low_water_mark, info.local_low_water_mark) == (
                -1,
                -1,
                -1,
            )
            # ...but older sessions are still fenced.
            with pytest.raises(StorageFailure) as info:
                await c.max_transaction_id(SESSION - 1, 0)
            assert info.value.error == StorageError.SESSION_FENCED
            # The server's catch-up copies the log back from transaction 0.
            await c.append(SESSION + 1, 0, records(0, COUNT)[:300])
            await c.set_low_water_mark(SESSION + 1, 0, 299)
            assert await c.record(SESSION + 1, 0, 299) == records(0, COUNT)[299]

    run(rejoin())
    assert node.stop() == 0
    result = waltz("storage", "verify", str(data))
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_torn_tail_above_the_low_water_mark_is_still_cut(
    golden, storage_factory, waltz, tmp_path: Path
) -> None:
    """Partition 2's local low-water mark is 1000: a 10-byte cut of its last record, with
    the index emptied, is a torn tail above anything it acknowledged as committed."""
    data = tmp_path / "data"
    shutil.copytree(golden["one segment"], data)
    cut_ten_bytes_index_emptied(data / "2")
    node = start_on(storage_factory, data)
    status, body = node.get("/readyz")
    assert status == 200, body

    async def check() -> None:
        async with await node.client() as c:
            assert await c.max_transaction_id(SESSION, 2) == COUNT - 2

    run(check())
    assert "cutting" in node.log() and "torn tail" in node.log()
    assert node.stop() == 0
    assert waltz("storage", "verify", str(data)).returncode == 0


def test_damage_with_intact_records_after_it_is_corruption_above_the_mark_too(
    golden, storage_factory, waltz, tmp_path: Path
) -> None:
    """A flipped bit in transaction 1250 of partition 2 (local low-water mark 1000), with the
    index emptied: the 1,249 intact records after it show it is not a torn tail."""
    data = tmp_path / "data"
    shutil.copytree(golden["one segment"], data)
    flip_bit_mid_segment_index_emptied(data / "2")
    damaged = snapshot(data / "2")
    node = start_on(storage_factory, data)
    status, body = node.get("/readyz")
    assert status == 503, body
    reason = json.loads(body)["unavailable_partitions"]["2"]
    assert "transaction 1251" in reason and "intact" in reason, reason
    assert_names_both(reason, 1249, LOW_FLOOR)
    assert node.stop() == 0
    assert snapshot(data / "2") == damaged
    result = waltz("storage", "verify", str(data))
    assert result.returncode == 1
    assert_names_both(result.stdout, 1249, LOW_FLOOR)


def test_a_damaged_record_found_by_a_read_makes_the_partition_unready(
    golden, storage_factory, tmp_path: Path
) -> None:
    """Damage that appears while the node runs (behind its back): the read that finds it
    fails, and from then on the partition is unavailable and the node unready."""
    data = tmp_path / "data"
    shutil.copytree(golden["one segment"], data)
    node = start_on(storage_factory, data)
    assert node.get("/readyz")[0] == 200
    flip_bit_mid_segment(data / "0")

    async def read() -> None:
        async with await node.client() as c:
            with pytest.raises(StorageFailure) as info:
                await c.record(SESSION, 0, 1250)
            assert info.value.error == StorageError.IO_ERROR
            assert "transaction 1250" in info.value.message
            with pytest.raises(StorageFailure) as info:
                await c.max_transaction_id(SESSION, 0)
            assert info.value.error == StorageError.PARTITION_UNAVAILABLE

    run(read())
    status, body = node.get("/readyz")
    assert status == 503, body
    assert "transaction 1250" in json.loads(body)["unavailable_partitions"]["0"]
    assert gauge(scrape(node), "available", 0) == 0
    assert node.get("/healthz")[0] == 200
    assert node.stop() == 0


def test_golden_layout_is_what_the_cases_assume(golden) -> None:
    """The offsets the damage functions compute are the real ones (the index says so)."""
    idx = (golden["one segment"] / "0" / IDX).read_bytes()
    entries = struct.unpack(f">{COUNT}q", idx[HEADER_BYTES:])
    assert list(entries) == [offset_of(t) for t in range(COUNT)]
