"""A real storage process with the compiled per-record loops and with the Python ones
(``WALTZ_PURE_PYTHON=1``): the same appends stored, the same records read back, and the
same refusals, word for word, of an append out of order and of a read of damaged data."""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from pathlib import Path

import pytest

from waltz_client.wire.records import Record, RecordBatch, ReqId
from waltz_client.wire.storage_client import StorageClient, StorageFailure
from waltz_client.wire.storage_messages import StorageError
from waltz_storage.bench import start_storage_process

SESSION = 1


def batch(first: int, sizes: list[int], rng: random.Random) -> RecordBatch:
    return RecordBatch.from_records(
        [
            Record(first + i, ReqId(9, 1, 0, first + i), i, rng.randbytes(size))
            for i, size in enumerate(sizes)
        ]
    )


async def exercise(port: int, key: uuid.UUID, segment: Path) -> dict[str, object]:
    """Appends, reads, an append out of order, then a read of a record damaged on disk."""
    rng = random.Random(5)
    seen: dict[str, object] = {}
    async with await StorageClient.connect("127.0.0.1", port) as client:
        await client.open(key, 1)
        assert await client.max_transaction_id(SESSION, 0) == -1
        sent = [batch(0, [0], rng), batch(1, [rng.randrange(3000) for _ in range(50)], rng)]
        sent.append(batch(51, [1024] * 200, rng))
        for b in sent:
            await client.append(SESSION, 0, b)
        back = await client.records(SESSION, 0, 0, 1000)
        seen["read back"] = back.buf == b"".join(b.buf for b in sent)
        seen["spans"] = [(txid, length) for txid, _, length in back.spans] == [
            (txid, length) for b in sent for txid, _, length in b.spans
        ]
        first, after_a_gap = batch(251, [10], rng), batch(253, [10], rng)  # 252 missing
        gapped = RecordBatch.from_records([*first.records(), *after_a_gap.records()])
        with pytest.raises(StorageFailure) as refused:
            await client.append(SESSION, 0, gapped)
        seen["gap"] = (refused.value.error, str(refused.value))
        # One byte of transaction 120's data flipped on disk, behind the node's back.
        offsets = await asyncio.to_thread(record_offsets, segment.with_suffix(".idx"))
        fd = os.open(segment, os.O_RDWR)
        try:
            where = offsets[120] + 44 + 500  # past the 44-byte head (segment format 2)
            os.pwrite(fd, bytes([os.pread(fd, 1, where)[0] ^ 0x40]), where)
        finally:
            os.close(fd)
        with pytest.raises(StorageFailure) as damaged:
            await client.records(SESSION, 0, 100, 50)
        seen["damage"] = (damaged.value.error, str(damaged.value).replace(str(segment), "SEG"))
    return seen


def record_offsets(index: Path) -> list[int]:
    raw = index.read_bytes()[128:]
    return [int.from_bytes(raw[i : i + 8], "big") for i in range(0, len(raw), 8)]


def run_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pure: str) -> dict[str, object]:
    key = uuid.uuid4()
    work = tmp_path / f"pure-{pure}"
    work.mkdir()
    with monkeypatch.context() as m:
        m.setenv("WALTZ_PURE_PYTHON", pure)  # the node inherits it
        proc, ready = start_storage_process(str(work), key, 1)
    try:
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
        assert f"WALTZ_PURE_PYTHON={pure}".encode() in environ
        segment = work / "data" / "0" / f"{0:019d}.seg"
        return asyncio.run(exercise(ready["port"], key, segment))
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_node_behaves_the_same_with_either_loops(tmp_path, monkeypatch):
    compiled = run_node(tmp_path, monkeypatch, "0")
    python = run_node(tmp_path, monkeypatch, "1")
    assert compiled == python
    assert compiled["read back"] is True and compiled["spans"] is True
    error, message = compiled["gap"]
    assert error == StorageError.NON_CONTIGUOUS
    assert "expected transaction 252, got 253 (record 1 of the batch)" in message
    error, message = compiled["damage"]
    assert error == StorageError.IO_ERROR
    assert "transaction 120" in message and "checksum mismatch" in message
