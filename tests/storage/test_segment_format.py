"""The byte layout of a segment (segment_format.py): the header codec and the record
check, on bytes built here from the documented layout (no files)."""

from __future__ import annotations

import struct
import uuid
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from waltz_client.wire.records import Record, RecordBatch, ReqId
from waltz_storage.errors import CorruptSegment
from waltz_storage.segment import wire_to_disk
from waltz_storage.segment_format import (
    HEADER_BYTES,
    RECORD_OVERHEAD,
    check_record,
    decode_header,
    encode_header,
    segment_stem,
)

i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)


def disk_record(txid: int, data: bytes, header: int = 7) -> bytes:
    """One record as the documented layout has it: head (36 bytes), data, head CRC."""
    head = struct.pack(">qiiiiiiI", txid, 1, 2, 3, 4, header, len(data), zlib.crc32(data))
    return head + data + struct.pack(">I", zlib.crc32(head))


@given(key=st.uuids(), partition=i32, first=i64, created=i64)
def test_a_header_reads_back_as_written(
    key: uuid.UUID, partition: int, first: int, created: int
) -> None:
    header = encode_header(key, partition, first, created)
    assert len(header) == HEADER_BYTES and header[44:] == bytes(84)
    assert decode_header(header, "x.seg") == (1, created, key, partition, first)


@given(at=st.integers(0, 43), flip=st.integers(1, 255))
def test_a_changed_header_byte_is_found(at: int, flip: int) -> None:
    header = bytearray(encode_header(uuid.UUID(int=5), 2, 1000, 1_700_000_000_000))
    header[at] ^= flip
    with pytest.raises(CorruptSegment, match=r"x\.seg: header checksum mismatch"):
        decode_header(bytes(header), "x.seg")


def test_a_short_header_and_another_version_are_refused() -> None:
    with pytest.raises(CorruptSegment, match="header is 127 bytes, expected 128"):
        decode_header(bytes(127), "x.seg")
    head = struct.pack(">iq16siq", 2, 0, bytes(16), 0, 0)
    other = (head + struct.pack(">I", zlib.crc32(head))).ljust(HEADER_BYTES, b"\x00")
    with pytest.raises(CorruptSegment, match="format version 2 not supported"):
        decode_header(other, "x.seg")


def test_segment_files_are_named_by_their_first_transaction() -> None:
    assert segment_stem(0) == "0000000000000000000"
    assert segment_stem(2**63 - 1) == "9223372036854775807"


@given(txid=st.integers(0, 2**62), data=st.binary(max_size=300))
def test_a_whole_record_passes_and_every_cut_of_it_is_named(txid: int, data: bytes) -> None:
    record = disk_record(txid, data)
    assert len(record) == len(data) + RECORD_OVERHEAD
    assert check_record(record, 0, txid) is None
    assert check_record(b"pad" + record, 3, txid) is None
    assert check_record(record, 0, txid + 1) == (
        f"transaction id {txid} where {txid + 1} was expected"
    )
    for end in range(len(record)):
        problem = check_record(record[:end], 0, txid)
        assert problem is not None and "cut short" in problem


@given(data=st.binary(min_size=1, max_size=100), at=st.data())
def test_a_changed_record_byte_is_found(data: bytes, at: st.DataObject) -> None:
    record = bytearray(disk_record(11, data))
    i = at.draw(st.integers(0, len(record) - 1))
    record[i] ^= at.draw(st.integers(1, 255))
    assert check_record(bytes(record), 0, 11) is not None


@given(data=st.lists(st.binary(max_size=200), min_size=1, max_size=5))
def test_a_wire_batch_converts_to_exactly_the_documented_records(data: list[bytes]) -> None:
    records = [Record(20 + i, ReqId(1, 2, 3, 4), 7, d) for i, d in enumerate(data)]
    out = bytearray()
    sizes = wire_to_disk(RecordBatch.from_records(records), 0, len(records), out)
    assert bytes(out) == b"".join(disk_record(20 + i, d) for i, d in enumerate(data))
    assert sizes == [len(d) + RECORD_OVERHEAD for d in data]
