"""The control file ``waltz-storage.ctl``: byte layout, alternating CRC'd slots, fallback, errors.

Also the node-level consequences: a cluster-key mismatch, or more partitions on disk
than configured, refuses the whole node, while a partition whose two slots are both
damaged is kept unavailable and the other partitions serve.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import time
import uuid
import zlib
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from waltz_client.cluster.metadata import key_fingerprint
from waltz_client.wire.records import Record, RecordBatch, ReqId
from waltz_client.wire.storage_messages import (
    AppendRequest,
    FailureResponse,
    LastSessionInfoRequest,
    LastSessionInfoResponse,
    MaxTransactionIdRequest,
    MaxTransactionIdResponse,
    SetLowWaterMarkRequest,
    StorageError,
    SuccessResponse,
)
from waltz_storage import admin
from waltz_storage.control_file import CONTROL_FILE_NAME, ControlFile, PartitionInfo
from waltz_storage.errors import ControlFileError
from waltz_storage.inspect import read_control_file
from waltz_storage.service import EngineSettings, StorageNode

KEY = uuid.UUID("0badc0de-1234-4abc-8def-0123456789ab")
OTHER_KEY = uuid.UUID("feedbeef-9999-4abc-8def-ba9876543210")

# The layout, spelled out independently of the module's constants.
HEADER_BYTES = 128
ENTRY_BYTES = 4 + 2 * 48
INFO_BYTES = 48
HEADER_CRC_COVERS = 32  # i32 version, i64 created, 16-byte key, i32 partitions
INFO_CRC_COVERS = 44  # u64 seq, 4 x i64, u32 flags

I64 = st.integers(-(2**63), 2**63 - 1)


# --- helpers --------------------------------------------------------------------------------


def ctl_path(directory: Path) -> Path:
    return directory / CONTROL_FILE_NAME


def slot_offset(partition: int, slot: int) -> int:
    return HEADER_BYTES + ENTRY_BYTES * partition + 4 + INFO_BYTES * slot


def flip_byte(path: Path, offset: int, mask: int = 0x40) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        (b,) = f.read(1)
        f.seek(offset)
        f.write(bytes([b ^ mask]))


def raw_slot(path: Path, partition: int, slot: int) -> bytes:
    data = path.read_bytes()
    start = slot_offset(partition, slot)
    return data[start : start + INFO_BYTES]


def decode_slot_independently(raw: bytes) -> dict | None:
    """Decode a 48-byte struct without the module under test (None when its CRC fails)."""
    assert len(raw) == INFO_BYTES
    (crc,) = struct.unpack_from(">I", raw, INFO_CRC_COVERS)
    if zlib.crc32(raw[:INFO_CRC_COVERS]) != crc:
        return None
    seq, fence, session, lwm, llwm, flags = struct.unpack_from(">QqqqqI", raw)
    return {
        "sequence": seq,
        "fence_session_id": fence,
        "session_id": session,
        "low_water_mark": lwm,
        "local_low_water_mark": llwm,
        "flags": flags,
    }


def newest_slot(path: Path, partition: int) -> int:
    a = decode_slot_independently(raw_slot(path, partition, 0))
    b = decode_slot_independently(raw_slot(path, partition, 1))
    assert a is not None and b is not None
    return 0 if a["sequence"] > b["sequence"] else 1


def open_node(directory: Path, partitions: set[int], num: int = 3, key: uuid.UUID = KEY):
    return StorageNode.open(
        str(directory), key, num, partitions, EngineSettings(segment_bytes=64 * 1024)
    )


def records(first: int, n: int) -> RecordBatch:
    return RecordBatch.from_records(
        [Record(t, ReqId(7, 1, 0, t), t, f"record {t}".encode()) for t in range(first, first + n)]
    )


# --- layout and round trip ------------------------------------------------------------------


def test_create_then_open_round_trips_the_header(tmp_path: Path) -> None:
    before = int(time.time() * 1000)
    created = ControlFile.create(str(tmp_path), KEY, 3)
    after = int(time.time() * 1000)
    created.close()

    ctl = ControlFile.open(str(tmp_path))
    try:
        assert ctl.cluster_key == KEY
        assert ctl.num_partitions == 3
        assert ctl.version == 1
        assert before <= ctl.created_ms <= after
        assert ctl.path == str(ctl_path(tmp_path))
        for p in range(3):
            # A fresh file: both slots valid, slot 1 (sequence 1) is the newest.
            assert ctl.read_partition(p) == PartitionInfo(sequence=1)
            assert ctl.read_slots(p) == (PartitionInfo(sequence=0), PartitionInfo(sequence=1))
    finally:
        ctl.close()
    # No temporary file is left behind by the atomic create.
    assert sorted(os.listdir(tmp_path)) == [CONTROL_FILE_NAME]


def test_header_and_entries_have_the_documented_bytes(tmp_path: Path) -> None:
    ControlFile.create(str(tmp_path), KEY, 2).close()
    data = ctl_path(tmp_path).read_bytes()
    assert len(data) == HEADER_BYTES + 2 * ENTRY_BYTES == 328

    version, created, key, n = struct.unpack_from(">iq16si", data, 0)
    assert (version, uuid.UUID(bytes=key), n) == (1, KEY, 2)
    assert abs(created - time.time() * 1000) < 60_000
    (crc,) = struct.unpack_from(">I", data, HEADER_CRC_COVERS)
    assert crc == zlib.crc32(data[:HEADER_CRC_COVERS])
    assert data[HEADER_CRC_COVERS + 4 : HEADER_BYTES] == bytes(92)

    for p in range(2):
        base = HEADER_BYTES + ENTRY_BYTES * p
        assert struct.unpack_from(">i", data, base) == (p,)
        for slot in (0, 1):
            decoded = decode_slot_independently(raw_slot(ctl_path(tmp_path), p, slot))
            assert decoded == {
                "sequence": slot,
                "fence_session_id": -1,
                "session_id": -1,
                "low_water_mark": -1,
                "local_low_water_mark": -1,
                "flags": 0,
            }


@given(
    seq=st.integers(0, 2**64 - 1),
    fence=I64,
    session=I64,
    lwm=I64,
    llwm=I64,
    flags=st.integers(0, 2**32 - 1),
)
def test_partition_info_encode_decode_round_trip(seq, fence, session, lwm, llwm, flags) -> None:
    info = PartitionInfo(seq, fence, session, lwm, llwm, flags)
    raw = info.encode()
    assert len(raw) == INFO_BYTES
    assert struct.unpack_from(">QqqqqI", raw) == (seq, fence, session, lwm, llwm, flags)
    assert struct.unpack_from(">I", raw, INFO_CRC_COVERS) == (zlib.crc32(raw[:INFO_CRC_COVERS]),)
    assert PartitionInfo.decode(raw) == info


@given(
    info=st.builds(PartitionInfo, st.integers(0, 2**64 - 1), I64, I64, I64, I64),
    position=st.integers(0, INFO_BYTES - 1),
    mask=st.integers(1, 255),
)
def test_any_damaged_byte_of_a_struct_is_detected(info, position, mask) -> None:
    raw = bytearray(info.encode())
    raw[position] ^= mask
    assert PartitionInfo.decode(bytes(raw)) is None


# --- alternating writes ---------------------------------------------------------------------


def test_writes_alternate_slots_and_the_other_slot_keeps_the_previous_state(
    tmp_path: Path,
) -> None:
    ctl = ControlFile.create(str(tmp_path), KEY, 2)
    path = ctl_path(tmp_path)
    try:
        previous = ctl.read_partition(1)
        expected_slot = 0  # fresh file: slot 1 is newest, so the first write goes to slot 0
        for i in range(1, 8):
            info = PartitionInfo(
                fence_session_id=10 * i, session_id=10 * i - 1, low_water_mark=i, flags=i
            )
            untouched = raw_slot(path, 1, 1 - expected_slot)
            stored = ctl.write_partition(1, info)

            assert stored == replace(info, sequence=previous.sequence + 1)
            assert stored.sequence == i + 1
            # The written slot holds the new state, the other one still the previous.
            assert PartitionInfo.decode(raw_slot(path, 1, expected_slot)) == stored
            assert raw_slot(path, 1, 1 - expected_slot) == untouched
            assert PartitionInfo.decode(untouched) == previous
            assert newest_slot(path, 1) == expected_slot
            assert ctl.read_partition(1) == stored
            # Partition 0's slots are never touched.
            assert ctl.read_slots(0) == (PartitionInfo(sequence=0), PartitionInfo(sequence=1))

            previous = stored
            expected_slot = 1 - expected_slot
    finally:
        ctl.close()

    reopened = ControlFile.open(str(tmp_path))
    try:
        assert reopened.read_partition(1) == previous
    finally:
        reopened.close()


def test_write_partition_fsyncs_the_control_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctl = ControlFile.create(str(tmp_path), KEY, 1)
    synced: list[int] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        synced.append(os.fstat(fd).st_ino)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    try:
        ctl.write_partition(0, PartitionInfo(fence_session_id=3))
    finally:
        ctl.close()
    assert synced == [os.stat(ctl_path(tmp_path)).st_ino]


# --- damaged slots --------------------------------------------------------------------------


@pytest.mark.parametrize("offset_in_struct", [0, 7, 8, 20, 40, 43, 44, 47])
def test_damaged_newest_slot_falls_back_to_the_previous_state(
    tmp_path: Path, offset_in_struct: int
) -> None:
    ctl = ControlFile.create(str(tmp_path), KEY, 3)
    path = ctl_path(tmp_path)
    old = ctl.write_partition(1, PartitionInfo(fence_session_id=5, session_id=5, low_water_mark=9))
    new = ctl.write_partition(1, PartitionInfo(fence_session_id=6, session_id=6, low_water_mark=20))
    ctl.close()
    damaged = newest_slot(path, 1)

    flip_byte(path, slot_offset(1, damaged) + offset_in_struct)

    ctl = ControlFile.open(str(tmp_path))
    try:
        slots = ctl.read_slots(1)
        assert slots[damaged] is None
        assert slots[1 - damaged] == old
        assert ctl.read_partition(1) == old  # rolled back to the previous state
        assert ctl.read_partition(1) != new
        # The next write goes into the damaged slot, keeping the surviving one.
        repaired = ctl.write_partition(1, PartitionInfo(fence_session_id=7))
        assert repaired.sequence == old.sequence + 1
        assert ctl.read_slots(1)[damaged] == repaired
        assert ctl.read_slots(1)[1 - damaged] == old
        assert ctl.read_partition(1) == repaired
    finally:
        ctl.close()


def test_damaged_older_slot_keeps_the_newest(tmp_path: Path) -> None:
    ctl = ControlFile.create(str(tmp_path), KEY, 1)
    path = ctl_path(tmp_path)
    ctl.write_partition(0, PartitionInfo(fence_session_id=1))
    newest = ctl.write_partition(0, PartitionInfo(fence_session_id=2))
    ctl.close()
    flip_byte(path, slot_offset(0, 1 - newest_slot(path, 0)) + 10)
    ctl = ControlFile.open(str(tmp_path))
    try:
        assert ctl.read_partition(0) == newest
    finally:
        ctl.close()


def test_both_slots_damaged_names_the_partition_and_spares_the_others(tmp_path: Path) -> None:
    ctl = ControlFile.create(str(tmp_path), KEY, 3)
    path = ctl_path(tmp_path)
    infos = {p: ctl.write_partition(p, PartitionInfo(fence_session_id=p + 1)) for p in range(3)}
    ctl.close()
    flip_byte(path, slot_offset(1, 0) + 3)
    flip_byte(path, slot_offset(1, 1) + 45)

    ctl = ControlFile.open(str(tmp_path))
    try:
        with pytest.raises(ControlFileError, match=r"partition 1\b") as excinfo:
            ctl.read_partition(1)
        assert "both" in str(excinfo.value)
        assert CONTROL_FILE_NAME in str(excinfo.value)
        assert ctl.read_partition(0) == infos[0]
        assert ctl.read_partition(2) == infos[2]
    finally:
        ctl.close()


def test_damaged_partition_id_label_is_an_error_naming_the_partition(tmp_path: Path) -> None:
    ControlFile.create(str(tmp_path), KEY, 2).close()
    flip_byte(ctl_path(tmp_path), HEADER_BYTES + ENTRY_BYTES * 1 + 3, mask=0x04)
    ctl = ControlFile.open(str(tmp_path))
    try:
        with pytest.raises(ControlFileError, match=r"entry 1 is labelled partition 5"):
            ctl.read_partition(1)
        assert ctl.read_partition(0) == PartitionInfo(sequence=1)
    finally:
        ctl.close()


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(
        st.one_of(
            st.tuples(st.just("write"), st.integers(-1, 1000), st.integers(-1, 1000)),
            st.tuples(st.just("tear"), st.integers(0, INFO_BYTES - 1), st.integers(1, 255)),
        ),
        min_size=1,
        max_size=25,
    )
)
def test_model_of_writes_and_torn_writes(tmp_path_factory, steps) -> None:
    """A torn (damaged) newest slot always reads as the state before the last write."""
    directory = tmp_path_factory.mktemp("ctl")
    ctl = ControlFile.create(str(directory), KEY, 2)
    path = ctl_path(directory)
    try:
        history = [ctl.read_partition(1)]  # states in the order they were written
        torn = False
        for step in steps:
            if step[0] == "write":
                _, session, mark = step
                stored = ctl.write_partition(
                    1,
                    PartitionInfo(
                        fence_session_id=session, session_id=session, low_water_mark=mark
                    ),
                )
                # A write after a tear goes into the torn slot; the survivor is kept.
                torn = False
                history.append(stored)
            elif not torn and len(history) >= 2:
                _, position, mask = step
                damaged = newest_slot(path, 1)
                flip_byte(path, slot_offset(1, damaged) + position, mask)
                history.pop()
                torn = True
            expected = history[-1]
            assert ctl.read_partition(1) == expected
            reopened = ControlFile.open(str(directory))
            try:
                assert reopened.read_partition(1) == expected
                assert reopened.read_partition(0) == PartitionInfo(sequence=1)
            finally:
                reopened.close()
    finally:
        ctl.close()


# --- header and file errors -----------------------------------------------------------------


@pytest.mark.parametrize("offset", [0, 3, 4, 11, 12, 27, 28, 31, 32, 35])
def test_damaged_header_is_a_clear_error(tmp_path: Path, offset: int) -> None:
    ControlFile.create(str(tmp_path), KEY, 2).close()
    flip_byte(ctl_path(tmp_path), offset)
    with pytest.raises(ControlFileError, match="header checksum mismatch") as excinfo:
        ControlFile.open(str(tmp_path))
    assert str(ctl_path(tmp_path)) in str(excinfo.value)
    # The node refuses to start on it rather than silently re-initialising.
    with pytest.raises(ControlFileError, match="header checksum mismatch"):
        open_node(tmp_path, {0}, num=2)
    assert ctl_path(tmp_path).stat().st_size == HEADER_BYTES + 2 * ENTRY_BYTES


def test_short_header_is_a_clear_error(tmp_path: Path) -> None:
    ControlFile.create(str(tmp_path), KEY, 2).close()
    os.truncate(ctl_path(tmp_path), 100)
    with pytest.raises(ControlFileError, match="header is 100 bytes, expected 128"):
        ControlFile.open(str(tmp_path))


def test_file_too_short_for_its_partitions_is_an_error(tmp_path: Path) -> None:
    ControlFile.create(str(tmp_path), KEY, 3).close()
    os.truncate(ctl_path(tmp_path), HEADER_BYTES + 2 * ENTRY_BYTES + 50)
    with pytest.raises(ControlFileError, match="expected 428 for 3 partitions"):
        ControlFile.open(str(tmp_path))


def test_unsupported_format_version_is_refused(tmp_path: Path) -> None:
    ControlFile.create(str(tmp_path), KEY, 1).close()
    path = ctl_path(tmp_path)
    data = bytearray(path.read_bytes())
    struct.pack_into(">i", data, 0, 2)
    struct.pack_into(">I", data, HEADER_CRC_COVERS, zlib.crc32(bytes(data[:HEADER_CRC_COVERS])))
    path.write_bytes(bytes(data))
    with pytest.raises(ControlFileError, match="format version 2 is not supported"):
        ControlFile.open(str(tmp_path))


def test_missing_file_and_bad_partition_numbers(tmp_path: Path) -> None:
    with pytest.raises(ControlFileError, match="no control file"):
        ControlFile.open(str(tmp_path))
    with pytest.raises(ControlFileError, match="at least 1"):
        ControlFile.create(str(tmp_path), KEY, 0)
    ctl = ControlFile.create(str(tmp_path), KEY, 2)
    try:
        for p in (-1, 2):
            with pytest.raises(ControlFileError, match=r"outside 0\.\.1"):
                ctl.read_partition(p)
    finally:
        ctl.close()


# --- the node on top of the control file ----------------------------------------------------


def test_node_creates_the_control_file_and_reopens_it(tmp_path: Path) -> None:
    node = open_node(tmp_path, {0, 2})
    try:
        assert node.cluster_key == KEY
        assert node.num_partitions == 3
        assert sorted(node.partitions) == [0, 2]
        assert (tmp_path / "0").is_dir() and (tmp_path / "2").is_dir()
        assert not (tmp_path / "1").exists()
    finally:
        node.close()
    node = open_node(tmp_path, {1})
    try:
        assert node.partitions[1].unavailable is None
    finally:
        node.close()


def test_node_never_reinitialises_over_data_without_a_control_file(tmp_path: Path) -> None:
    node = open_node(tmp_path, {0, 2})
    try:
        node.partitions[0].process([AppendRequest(1, 1, 0, records(0, 2))])
    finally:
        node.close()
    ctl_path(tmp_path).unlink()
    with pytest.raises(
        ControlFileError, match=r"no waltz-storage\.ctl but partition directories 0, 2"
    ):
        open_node(tmp_path, {0})
    assert not ctl_path(tmp_path).exists()
    assert (tmp_path / "0" / "0000000000000000000.seg").stat().st_size > 128


def test_node_with_another_cluster_key_is_refused_naming_both_fingerprints(tmp_path: Path) -> None:
    open_node(tmp_path, {0}).close()
    before = ctl_path(tmp_path).read_bytes()
    with pytest.raises(ControlFileError) as excinfo:
        open_node(tmp_path, {0}, key=OTHER_KEY)
    message = str(excinfo.value)
    # Fingerprints tell the keys apart; neither key appears, even in part.
    assert key_fingerprint(KEY) in message
    assert key_fingerprint(OTHER_KEY) in message
    assert str(KEY)[:8] not in message and str(OTHER_KEY)[:8] not in message
    assert ctl_path(tmp_path).read_bytes() == before


def test_node_with_more_partitions_on_disk_than_configured_is_refused(tmp_path: Path) -> None:
    """Partitions never shrink (fewer on disk grows: test_storage_partition_growth)."""
    open_node(tmp_path, {0}).close()
    before = ctl_path(tmp_path).read_bytes()
    with pytest.raises(ControlFileError, match=r"has 3 partitions.*configured with 2"):
        open_node(tmp_path, {0}, num=2)
    with pytest.raises(ControlFileError, match=r"partitions \[3\] are outside 0\.\.2"):
        open_node(tmp_path, {0, 3})
    assert ctl_path(tmp_path).read_bytes() == before


def test_partition_with_both_slots_damaged_stays_unavailable_others_serve(tmp_path: Path) -> None:
    node = open_node(tmp_path, {0, 1, 2})
    try:
        for p in range(3):
            responses = node.partitions[p].process(
                [AppendRequest(4, 1, p, records(0, 3)), SetLowWaterMarkRequest(4, 2, p, 2)]
            )
            assert responses == [SuccessResponse(4, 1, p), SuccessResponse(4, 2, p)]
    finally:
        node.close()
    path = ctl_path(tmp_path)
    flip_byte(path, slot_offset(1, 0) + 12)
    flip_byte(path, slot_offset(1, 1) + 30)

    node = open_node(tmp_path, {0, 1, 2})
    try:
        bad = node.partitions[1]
        assert bad.unavailable is not None
        assert "partition 1" in bad.unavailable
        assert bad.snapshot()["available"] == 0
        for request in (
            MaxTransactionIdRequest(4, 3, 1),
            AppendRequest(4, 4, 1, records(3, 1)),
            LastSessionInfoRequest(9, 5, 1),
        ):
            (response,) = bad.process([request])
            assert isinstance(response, FailureResponse)
            assert response.error == StorageError.PARTITION_UNAVAILABLE
            assert "partition 1" in response.message
        for p in (0, 2):
            svc = node.partitions[p]
            assert svc.unavailable is None
            assert svc.process(
                [MaxTransactionIdRequest(4, 6, p), LastSessionInfoRequest(4, 7, p)]
            ) == [
                MaxTransactionIdResponse(4, 6, p, 2),
                LastSessionInfoResponse(4, 7, p, 4, 2, 2),
            ]
    finally:
        node.close()


# --- the offline reader ---------------------------------------------------------------------


def test_read_control_file_and_the_control_command(tmp_path: Path, capsys) -> None:
    ctl = ControlFile.create(str(tmp_path), KEY, 2)
    stored = ctl.write_partition(
        0, PartitionInfo(fence_session_id=8, session_id=7, low_water_mark=3)
    )
    ctl.close()
    flip_byte(ctl_path(tmp_path), slot_offset(1, 1) + 2)

    before = ctl_path(tmp_path).read_bytes()
    report = read_control_file(str(tmp_path))
    assert report.header_ok and report.cluster_key == KEY and report.num_partitions == 2
    assert report.partitions[0]["slots"][0]["fence_session_id"] == stored.fence_session_id
    assert report.partitions[0]["slots"][0]["sequence"] == 2
    assert report.partitions[1]["slots"][1] is None
    assert ctl_path(tmp_path).read_bytes() == before  # read-only

    status = admin.cmd_control(argparse.Namespace(directory=str(tmp_path), json=True))
    out = json.loads(capsys.readouterr().out)
    assert status == 0  # one bad slot of partition 1 is survivable
    assert out["cluster_key"] == str(KEY)
    assert out["partitions"][1]["slots"][1] is None

    flip_byte(ctl_path(tmp_path), slot_offset(1, 0) + 2)
    assert admin.cmd_control(argparse.Namespace(directory=str(tmp_path), json=False)) == 1
    assert "partition 1 slot 0: CHECKSUM MISMATCH" in capsys.readouterr().out
