"""The backup directory's files, without a cluster: any flipped byte of any file is found
and the file named; a cut-short or extended chunk, a missing chunk, an edited manifest
and a manifest whose chunks leave a gap are refused; a chunk is read back in batches
of whatever size, records larger than a read block included."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import zlib

import pytest

from waltz_client.tools.backup.format import (
    CHUNK_HEADER_BYTES,
    MANIFEST_NAME,
    BackupError,
    ChunkFile,
    ChunkWriter,
    Manifest,
    PartitionBackup,
    SourceCluster,
    chunk_name,
    leftover_files,
    read_chunk,
    verify_backup,
    with_files,
)
from waltz_client.wire.records import FORMAT_1, NO_TIMESTAMP, Record, RecordBatch, ReqId


def records(first: int, count: int, size=lambda i: 5 + i % 7) -> list[Record]:
    return [
        Record(t, ReqId(3, 2 + t % 2, 0, t + 1), t * 11, bytes([t % 251]) * size(t))
        for t in range(first, first + count)
    ]


def make_backup(directory: str, chunks: list[list[Record]], first: int = 0) -> Manifest:
    """One partition (0) of a two-partition backup; partition 1 empty."""
    os.makedirs(directory, exist_ok=True)
    source = SourceCluster("test", "/waltz", "sha256:000000000000", 2, 3)
    manifest = Manifest(
        source,
        "2020-01-01T00:00:00.000+00:00",
        {p: PartitionBackup(p, first, first - 1, first) for p in (0, 1)},
    )
    for rs in chunks:
        writer = ChunkWriter(directory, 0, rs[0].transaction_id)
        # Several batches per chunk, as the range reads deliver them.
        for i in range(0, len(rs), 3):
            writer.append(RecordBatch.from_records(rs[i : i + 3]))
        chunk = writer.finish()
        manifest.partitions[0] = with_files(
            manifest.partitions[0], chunk, max(r.req_id.generation for r in rs)
        )
    manifest.write(directory)
    return manifest


@pytest.fixture
def backup(tmp_path) -> str:
    directory = str(tmp_path / "backup")
    make_backup(directory, [records(0, 10), records(10, 7)])
    return directory


def test_a_backup_reads_back_exactly(backup):
    checked = verify_backup(backup)
    assert checked.records == 17 and checked.files == 2
    m = checked.manifest
    assert (m.partitions[0].first, m.partitions[0].high_water_mark) == (0, 16)
    assert m.partitions[0].max_generation == 3
    assert (m.partitions[1].first, m.partitions[1].high_water_mark) == (0, -1)
    got = [r for f in m.partitions[0].files for b in read_chunk(backup, 0, f) for r in b.records()]
    assert got == records(0, 17)
    # sha256sum of a chunk file agrees with the manifest.
    import hashlib

    for f in m.partitions[0].files:
        with open(os.path.join(backup, f.name), "rb") as fh:
            assert hashlib.sha256(fh.read()).hexdigest() == f.sha256


@pytest.mark.parametrize("block", [1, 7, 40, 100, 10_000])
def test_records_larger_than_a_read_block(tmp_path, block):
    directory = str(tmp_path / "b")
    rs = records(5, 9, size=lambda i: 0 if i == 7 else 300 * (i % 3))
    m = make_backup(directory, [rs], first=5)
    f = m.partitions[0].files[0]
    got = [r for b in read_chunk(directory, 0, f, block=block) for r in b.records()]
    assert got == rs


def test_every_flipped_byte_of_a_chunk_is_found_and_the_file_named(backup):
    m = Manifest.read(backup)
    chunk = m.partitions[0].files[1]
    path = os.path.join(backup, chunk.name)
    with open(path, "rb") as f:
        original = f.read()
    for i in range(len(original)):
        for bit in (0x01, 0x80):
            damaged = bytearray(original)
            damaged[i] ^= bit
            with open(path, "wb") as f:
                f.write(damaged)
            with pytest.raises(BackupError) as e:
                verify_backup(backup)
            assert path in str(e.value), (i, str(e.value))
    with open(path, "wb") as f:
        f.write(original)
    verify_backup(backup)


def test_every_flipped_byte_of_the_manifest_is_found(backup):
    path = os.path.join(backup, MANIFEST_NAME)
    with open(path, "rb") as f:
        original = f.read()
    for i in range(len(original)):
        damaged = bytearray(original)
        damaged[i] ^= 0x01 if i % 2 else 0x20
        with open(path, "wb") as f:
            f.write(damaged)
        with pytest.raises(BackupError) as e:
            verify_backup(backup)
        assert path in str(e.value)


def test_a_cut_short_an_extended_and_a_missing_chunk(backup):
    m = Manifest.read(backup)
    path = os.path.join(backup, m.partitions[0].files[0].name)
    with open(path, "rb") as f:
        original = f.read()
    for damaged, words in (
        (original[:-1], "truncated"),
        (original[:CHUNK_HEADER_BYTES], "truncated"),
        (original + b"\0", "extended"),
    ):
        with open(path, "wb") as f:
            f.write(damaged)
        with pytest.raises(BackupError, match=words) as e:
            verify_backup(backup)
        assert path in str(e.value)
    os.unlink(path)
    with pytest.raises(BackupError, match="missing") as e:
        verify_backup(backup)
    assert path in str(e.value)


def test_an_edited_manifest_with_a_recomputed_layout_is_refused(backup):
    """Editing a value (even keeping valid JSON) breaks the manifest's checksum."""
    path = os.path.join(backup, MANIFEST_NAME)
    with open(path) as f:
        doc = json.load(f)
    doc["manifest"]["partitions"][0]["high_water_mark"] = 15
    with open(path, "w") as f:
        json.dump(doc, f, indent=2, sort_keys=True)
    with pytest.raises(BackupError, match="checksum mismatch") as e:
        verify_backup(backup)
    assert path in str(e.value)


def test_a_manifest_whose_chunks_leave_a_gap_is_refused(tmp_path):
    directory = str(tmp_path / "gap")
    m = make_backup(directory, [records(0, 4)])
    # A consistent manifest (its checksum is right) that claims more than its chunks.
    m.partitions[0].high_water_mark = 9
    m.write(directory)
    with pytest.raises(BackupError, match="the chunks end at 3"):
        Manifest.read(directory)


def test_a_chunk_swapped_for_another_of_the_same_size_is_refused(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    m = make_backup(a, [records(0, 4)])
    other = [Record(r.transaction_id, r.req_id, r.header + 1, r.data) for r in records(0, 4)]
    make_backup(b, [other])
    name = m.partitions[0].files[0].name
    shutil.copy(os.path.join(b, name), os.path.join(a, name))
    with pytest.raises(BackupError, match="SHA-256 mismatch"):
        verify_backup(a)


def test_leftovers_of_a_stopped_run_are_found(backup):
    m = Manifest.read(backup)
    stray = os.path.join(backup, "partition-0", f"{17:019d}-{20:019d}.chunk")
    temporary = os.path.join(backup, "partition-1", f"{0:019d}.chunk.tmp")
    os.makedirs(os.path.dirname(temporary), exist_ok=True)
    for path in (stray, temporary):
        with open(path, "wb") as f:
            f.write(b"x")
    with open(os.path.join(backup, "partition-0", "notes.txt"), "w") as f:
        f.write("kept")
    assert leftover_files(backup, m) == [
        f"partition-0/{17:019d}-{20:019d}.chunk",
        f"partition-1/{0:019d}.chunk.tmp",
    ]


def timed(rs: list[Record], base: int = 1_800_000_000_000) -> list[Record]:
    return [
        Record(r.transaction_id, r.req_id, r.header, r.data, base + r.transaction_id // 3)
        for r in rs
    ]


def write_format_1_chunk(directory: str, rs: list[Record]) -> ChunkFile:
    """A chunk as a build before commit times wrote it: magic WALTZBK1, format-1 records."""
    first, last = rs[0].transaction_id, rs[-1].transaction_id
    head = struct.pack(">8siqq", b"WALTZBK1", 0, first, last)
    data = head + struct.pack(">I", zlib.crc32(head)) + RecordBatch.from_records(rs, FORMAT_1).buf
    name = chunk_name(0, first, last)
    os.makedirs(os.path.join(directory, "partition-0"), exist_ok=True)
    with open(os.path.join(directory, name), "wb") as f:
        f.write(data)
    return ChunkFile(name, first, last, len(data), hashlib.sha256(data).hexdigest())


def test_commit_times_are_kept(tmp_path):
    directory = str(tmp_path / "backup")
    make_backup(directory, [timed(records(0, 10)), timed(records(10, 5))])
    m = verify_backup(directory).manifest
    assert m.version == 2
    got = [
        r for f in m.partitions[0].files for b in read_chunk(directory, 0, f) for r in b.records()
    ]
    assert got == timed(records(0, 15))
    with open(os.path.join(directory, m.partitions[0].files[0].name), "rb") as f:
        assert f.read(8) == b"WALTZBK2"


def test_a_backup_of_an_older_build_still_reads_and_goes_on_in_the_new_format(tmp_path):
    directory = str(tmp_path / "backup")
    source = SourceCluster("test", "/waltz", "sha256:000000000000", 2, 3)
    old = Manifest(
        source,
        "2020-01-01T00:00:00.000+00:00",
        {p: PartitionBackup(p, 0, -1, 0) for p in (0, 1)},
        version=1,
    )
    chunk = write_format_1_chunk(directory, records(0, 8))
    old.partitions[0] = with_files(old.partitions[0], chunk, 3)
    old.write(directory)
    m = verify_backup(directory).manifest
    assert m.version == 1  # read as it was written: its bytes re-encode the same
    got = [r for b in read_chunk(directory, 0, chunk) for r in b.records()]
    assert got == records(0, 8)  # every time NO_TIMESTAMP
    assert {r.timestamp for r in got} == {NO_TIMESTAMP}
    # A run of this build appends a format-2 chunk and says so in the manifest.
    writer = ChunkWriter(directory, 0, 8)
    writer.append(RecordBatch.from_records(timed(records(8, 4))))
    m.partitions[0] = with_files(m.partitions[0], writer.finish(), 3)
    m.version = 2
    m.write(directory)
    m = verify_backup(directory).manifest
    got = [
        r for f in m.partitions[0].files for b in read_chunk(directory, 0, f) for r in b.records()
    ]
    assert got == records(0, 8) + timed(records(8, 4))


def test_a_manifest_of_an_unknown_version_is_refused(tmp_path):
    directory = str(tmp_path / "backup")
    make_backup(directory, [records(0, 3)])
    path = os.path.join(directory, MANIFEST_NAME)
    m = Manifest.read(directory)
    m.version = 3
    m.write(directory)
    with pytest.raises(BackupError, match=r"version 3 is not supported \(this build reads 1, 2\)"):
        Manifest.read(directory)
    assert os.path.exists(path)
