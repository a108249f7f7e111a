"""The byte layout of a segment (segment_format.py): the header codec and the record
check, on bytes built here from the documented layout (no files), in both segment
format versions: 1 (records without commit times, as older nodes wrote them) and 2."""

from __future__ import annotations

import struct
import uuid
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from waltz_client.wire.records import (
    FORMAT_1,
    FORMAT_2,
    NO_TIMESTAMP,
    Record,
    RecordBatch,
    RecordFormat,
    ReqId,
)
from waltz_storage.errors import CorruptSegment
from waltz_storage.segment import wire_to_disk
from waltz_storage.segment_format import (
    FORMAT_VERSION,
    HEADER_BYTES,
    check_record,
    decode_header,
    disk_head_bytes,
    disk_overhead,
    encode_header,
    record_format_of,
    segment_stem,
    segment_version,
)

i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
versions = st.sampled_from([1, 2])
# The documented record heads (wire head + data CRC), independent of the module.
DISK_HEADS = {1: struct.Struct(">qiiiiiiI"), 2: struct.Struct(">qiiiiiiqI")}
TIME = 1_767_225_600_123  # 2026-01-01T00:00:00.123Z


def disk_record(
    txid: int, data: bytes, header: int = 7, version: int = 2, time: int = TIME
) -> bytes:
    """One record as the documented layout has it: head (36 bytes in version 1, 44 with
    the commit time in version 2), data, head CRC."""
    timed = (time,) if version == 2 else ()
    head = DISK_HEADS[version].pack(txid, 1, 2, 3, 4, header, len(data), *timed, zlib.crc32(data))
    return head + data + struct.pack(">I", zlib.crc32(head))


def raw_header(version: int) -> bytes:
    head = struct.pack(">iq16siq", version, 0, bytes(16), 0, 0)
    return (head + struct.pack(">I", zlib.crc32(head))).ljust(HEADER_BYTES, b"\x00")


@given(key=st.uuids(), partition=i32, first=i64, created=i64, version=versions)
def test_a_header_reads_back_as_written(
    key: uuid.UUID, partition: int, first: int, created: int, version: int
) -> None:
    header = encode_header(key, partition, first, created, version)
    assert len(header) == HEADER_BYTES and header[44:] == bytes(84)
    assert struct.unpack_from(">i", header) == (version,)
    assert decode_header(header, "x.seg") == (version, created, key, partition, first)


def test_new_segments_are_version_2_and_versions_map_to_record_formats() -> None:
    assert FORMAT_VERSION == 2
    header = encode_header(uuid.UUID(int=1), 0, 0, 0)
    assert decode_header(header, "x.seg")[0] == 2
    assert (record_format_of(1), record_format_of(2)) == (FORMAT_1, FORMAT_2)
    assert (segment_version(FORMAT_1), segment_version(FORMAT_2)) == (1, 2)
    with pytest.raises(ValueError, match="segment format version 3 not supported"):
        record_format_of(3)
    with pytest.raises(ValueError, match="no segment format holds records of format 9"):
        segment_version(RecordFormat(9, struct.Struct(">q")))
    with pytest.raises(ValueError, match="segment format version 0 not supported"):
        encode_header(uuid.UUID(int=1), 0, 0, 0, version=0)


@given(at=st.integers(0, 43), flip=st.integers(1, 255), version=versions)
def test_a_changed_header_byte_is_found(at: int, flip: int, version: int) -> None:
    header = bytearray(encode_header(uuid.UUID(int=5), 2, 1000, 1_700_000_000_000, version))
    header[at] ^= flip
    with pytest.raises(CorruptSegment, match=r"x\.seg: header checksum mismatch"):
        decode_header(bytes(header), "x.seg")


@pytest.mark.parametrize("version", [0, 3, -1, 2**31 - 1])
def test_a_short_header_and_another_version_are_refused(version: int) -> None:
    with pytest.raises(CorruptSegment, match="header is 127 bytes, expected 128"):
        decode_header(bytes(127), "x.seg")
    with pytest.raises(CorruptSegment, match=f"x.seg: format version {version} not supported"):
        decode_header(raw_header(version), "x.seg")
    assert decode_header(raw_header(1), "x.seg")[0] == 1


def test_segment_files_are_named_by_their_first_transaction() -> None:
    assert segment_stem(0) == "0000000000000000000"
    assert segment_stem(2**63 - 1) == "9223372036854775807"


def test_the_record_sizes_of_each_format() -> None:
    assert (disk_head_bytes(FORMAT_1), disk_overhead(FORMAT_1)) == (36, 40)
    assert (disk_head_bytes(FORMAT_2), disk_overhead(FORMAT_2)) == (44, 48)


@given(txid=st.integers(0, 2**62), data=st.binary(max_size=300), version=versions)
def test_a_whole_record_passes_and_every_cut_of_it_is_named(
    txid: int, data: bytes, version: int
) -> None:
    fmt = record_format_of(version)
    record = disk_record(txid, data, version=version)
    assert len(record) == len(data) + {1: 40, 2: 48}[version]
    assert check_record(record, 0, txid, fmt) is None
    assert check_record(b"pad" + record, 3, txid, fmt) is None
    assert check_record(record, 0, txid + 1, fmt) == (
        f"transaction id {txid} where {txid + 1} was expected"
    )
    for end in range(len(record)):
        problem = check_record(record[:end], 0, txid, fmt)
        assert problem is not None and "cut short" in problem


def test_a_record_read_in_the_other_format_is_refused() -> None:
    for version, other in ((1, FORMAT_2), (2, FORMAT_1)):
        record = disk_record(5, b"some data", version=version)
        assert check_record(record + bytes(8), 0, 5, other) is not None


@given(data=st.binary(min_size=1, max_size=100), at=st.data(), version=versions)
def test_a_changed_record_byte_is_found(data: bytes, at: st.DataObject, version: int) -> None:
    record = bytearray(disk_record(11, data, version=version))
    i = at.draw(st.integers(0, len(record) - 1))
    record[i] ^= at.draw(st.integers(1, 255))
    assert check_record(bytes(record), 0, 11, record_format_of(version)) is not None


@given(
    data=st.lists(st.binary(max_size=200), min_size=1, max_size=5),
    version=versions,
    time=st.one_of(i64, st.just(NO_TIMESTAMP)),
)
def test_a_wire_batch_converts_to_exactly_the_documented_records(
    data: list[bytes], version: int, time: int
) -> None:
    fmt = record_format_of(version)
    stamp = time if version == 2 else NO_TIMESTAMP
    records = [Record(20 + i, ReqId(1, 2, 3, 4), 7, d, stamp) for i, d in enumerate(data)]
    out = bytearray()
    sizes = wire_to_disk(RecordBatch.from_records(records, fmt), 0, len(records), out)
    expected = [disk_record(20 + i, d, version=version, time=stamp) for i, d in enumerate(data)]
    assert bytes(out) == b"".join(expected)
    assert sizes == [len(d) + disk_overhead(fmt) for d in data]
