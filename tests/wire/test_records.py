"""ReqId, RecordHeader, Record and RecordBatch: byte layout, round trips, validation,
in both record formats.

Format 1: a 32-byte head (i64 txid, 4 x i32 ReqId, i32 header, i32 data length), the
data, a u32 CRC-32 of the data. Format 2 (the default): the same with the i64 commit time
after the data length (a 40-byte head, the time at offset 32, the length still at 28).
"""

from __future__ import annotations

import random
import struct
import zlib
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from waltz_client.wire.buffers import Reader
from waltz_client.wire.errors import ChecksumMismatch, MalformedMessage, ProtocolError
from waltz_client.wire.records import (
    DEFAULT_FORMAT,
    DEFAULT_MAX_DATA_BYTES,
    FORMAT_1,
    FORMAT_2,
    NO_TIMESTAMP,
    RECORD_FORMATS,
    RECORD_HEADER,
    TIMED_HEADER,
    Record,
    RecordBatch,
    RecordHeader,
    ReqId,
    UncheckedRecords,
    crc32,
)

I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
# Commit times: any i64, NO_TIMESTAMP (a record without one) often.
TIMES = st.one_of(st.just(NO_TIMESTAMP), st.integers(0, 2**45), I64)

# Transaction data up to ~2 KiB. Large payloads come from a seeded PRNG so a
# batch of 20 of them does not exhaust hypothesis' entropy buffer.
DATA = st.one_of(
    st.binary(max_size=64),
    st.builds(lambda n, seed: random.Random(seed).randbytes(n), st.integers(0, 2048), I64),
)
REQ_IDS = st.builds(ReqId, I32, I32, I32, I32)
HEADERS = st.builds(RecordHeader, I64, REQ_IDS, I32, TIMES)
RECORDS = st.builds(Record, I64, REQ_IDS, I32, DATA, TIMES)
RECORD_LISTS = st.lists(RECORDS, max_size=20)

HEAD_BYTES = {1: 32, 2: 40}  # by format version
CRC_BYTES = 4
TIME = 1_795_000_000_000  # 0x000001a1ee565e00: a commit time, ms since the epoch

BOTH_FORMATS = pytest.mark.parametrize("fmt", [FORMAT_1, FORMAT_2], ids=["format1", "format2"])


def wire_record(txid, req, header, data, length=None, crc=None, *, version=1, timestamp=TIME):
    """A record built by hand, independently of the code under test: format 1, or with
    ``version=2`` format 2 (``timestamp`` after the data length)."""
    head = struct.pack(
        ">qiiiiii",
        txid,
        req[0],
        req[1],
        req[2],
        req[3],
        header,
        len(data) if length is None else length,
    )
    if version >= 2:
        head += struct.pack(">q", timestamp)
    return head + data + struct.pack(">I", zlib.crc32(data) if crc is None else crc)


def hand_built(records: list[Record], version: int) -> bytes:
    """``records`` one after the other in format ``version``, built by hand."""
    return b"".join(
        wire_record(
            rec.transaction_id,
            (rec.req_id.client_id, rec.req_id.generation, rec.req_id.partition_id, rec.req_id.seq),
            rec.header,
            rec.data,
            version=version,
            timestamp=rec.timestamp,
        )
        for rec in records
    )


def untimed(rec: Record) -> Record:
    """``rec`` as format 1 carries it: without its commit time."""
    return replace(rec, timestamp=NO_TIMESTAMP)


def as_read(records: list[Record], version: int) -> list[Record]:
    """``records`` as reading them back in format ``version`` gives them."""
    return records if version >= 2 else [untimed(rec) for rec in records]


# --- crc32 -----------------------------------------------------------------------------


def test_crc32_is_the_zlib_polynomial_as_unsigned():
    assert crc32(b"123456789") == 0xCBF43926  # the CRC-32 check value
    assert crc32(b"") == 0
    assert crc32(b"\xff" * 4) == 0xFFFFFFFF
    assert crc32(memoryview(b"abc")) == crc32(bytearray(b"abc")) == 0x352441C2


@given(st.binary(max_size=256))
def test_crc32_never_negative(data):
    assert 0 <= crc32(data) <= 0xFFFFFFFF
    assert crc32(data) == zlib.crc32(data) & 0xFFFFFFFF


# --- the formats --------------------------------------------------------------------------


def test_the_record_formats():
    assert (FORMAT_1.version, FORMAT_1.head_size) == (1, 32)
    assert (FORMAT_2.version, FORMAT_2.head_size) == (2, 40)
    assert RECORD_FORMATS == {1: FORMAT_1, 2: FORMAT_2}
    assert DEFAULT_FORMAT is FORMAT_2
    assert NO_TIMESTAMP == -1
    assert (RECORD_HEADER.size, TIMED_HEADER.size) == (28, 36)


def test_format_2_is_the_default_everywhere():
    rec = Record(1, ReqId(2, 3, 4, 5), 6, b"abc", TIME)
    assert rec.encode() == rec.encode(FORMAT_2) != rec.encode(FORMAT_1)
    assert Record.read(Reader(rec.encode(FORMAT_2))) == rec
    header = RecordHeader(1, ReqId(2, 3, 4, 5), 6, TIME)
    assert header.encode() == header.encode(FORMAT_2) != header.encode(FORMAT_1)
    assert RecordHeader.read(Reader(header.encode(FORMAT_2))) == header
    assert RecordBatch(b"", []).format is FORMAT_2
    batch = RecordBatch.from_records([rec])
    assert batch.format is FORMAT_2
    assert batch.buf == rec.encode(FORMAT_2)
    assert RecordBatch.read(Reader(batch.buf), 1).format is FORMAT_2
    assert UncheckedRecords(batch.buf, 1).format is FORMAT_2
    assert Record(1, ReqId(0, 0, 0, 0), 0, b"").timestamp == NO_TIMESTAMP
    assert RecordHeader(1, ReqId(0, 0, 0, 0), 0).timestamp == NO_TIMESTAMP


# --- ReqId / RecordHeader / Record layouts ------------------------------------------------


def test_req_id_layout():
    assert ReqId(1, 2, 3, 4).encode() == bytes.fromhex("00000001 00000002 00000003 00000004")
    assert ReqId(-1, 0, 0, 0).encode()[:4] == b"\xff\xff\xff\xff"


def test_record_header_layout_format_2():
    header = RecordHeader(0x0102030405060708, ReqId(9, 10, 11, 12), -2, TIME)
    encoded = header.encode(FORMAT_2)
    assert encoded == bytes.fromhex(
        "0102030405060708 00000009 0000000a 0000000b 0000000c fffffffe 000001a1ee565e00"
    )
    assert len(encoded) == 36
    assert header.encode() == encoded  # the default
    # No commit time: NO_TIMESTAMP in its place.
    assert RecordHeader(1, ReqId(0, 0, 0, 0), 0).encode()[28:] == b"\xff" * 8


def test_record_header_layout_format_1():
    header = RecordHeader(0x0102030405060708, ReqId(9, 10, 11, 12), -2, TIME)
    encoded = header.encode(FORMAT_1)
    assert encoded == bytes.fromhex("0102030405060708 00000009 0000000a 0000000b 0000000c fffffffe")
    assert len(encoded) == 28  # the commit time is not sent


def test_record_layout_format_2():
    record = Record(1, ReqId(2, 3, 4, 5), 6, b"abc", TIME)
    encoded = record.encode(FORMAT_2)
    assert encoded == bytes.fromhex(
        "0000000000000001 00000002 00000003 00000004 00000005 00000006 00000003"
        "000001a1ee565e00 616263 352441c2"
    )
    assert len(encoded) == 40 + 3 + 4
    assert struct.unpack_from(">i", encoded, 28) == (3,)  # the data length, where it was
    assert struct.unpack_from(">q", encoded, 32) == (TIME,)  # the commit time after it
    assert encoded[40:43] == b"abc"
    assert record.encode() == encoded  # the default
    assert record.checksum == 0x352441C2


def test_record_layout_format_1():
    record = Record(1, ReqId(2, 3, 4, 5), 6, b"abc", TIME)
    assert record.encode(FORMAT_1) == bytes.fromhex(
        "0000000000000001 00000002 00000003 00000004 00000005 00000006 00000003616263 352441c2"
    )
    # The commit time is not sent: the same bytes as a record without one.
    assert record.encode(FORMAT_1) == untimed(record).encode(FORMAT_1)
    assert record.checksum == 0x352441C2


@given(REQ_IDS)
def test_req_id_round_trip(req):
    r = Reader(req.encode())
    assert ReqId.read(r) == req
    assert r.remaining == 0


@BOTH_FORMATS
@given(header=HEADERS)
def test_record_header_round_trip(fmt, header):
    encoded = header.encode(fmt)
    q = header.req_id
    fields = (header.transaction_id, q.client_id, q.generation, q.partition_id, q.seq)
    if fmt.version >= 2:
        assert encoded == struct.pack(">qiiiiiq", *fields, header.header, header.timestamp)
    else:
        assert encoded == struct.pack(">qiiiii", *fields, header.header)
    r = Reader(encoded)
    expected = header if fmt.version >= 2 else replace(header, timestamp=NO_TIMESTAMP)
    assert RecordHeader.read(r, fmt) == expected
    assert r.remaining == 0


@BOTH_FORMATS
@given(header=HEADERS, data=st.data())
def test_record_header_cut_short_names_the_field(fmt, header, data):
    encoded = header.encode(fmt)
    cut = data.draw(st.integers(0, len(encoded) - 1), label="cut")
    with pytest.raises(MalformedMessage, match=r"needs \d+ bytes at offset \d+, only \d+ left"):
        RecordHeader.read(Reader(encoded[:cut]), fmt)


@pytest.mark.parametrize(
    ("fmt", "cut", "message"),
    [
        (FORMAT_1, 24, r"^RecordHeader.header: needs 4 bytes at offset 24, only 0 left"),
        (FORMAT_2, 28, r"^RecordHeader.timestamp: needs 8 bytes at offset 28, only 0 left"),
        (FORMAT_2, 33, r"^RecordHeader.timestamp: needs 8 bytes at offset 28, only 5 left"),
    ],
)
def test_record_header_cut_in_its_last_field(fmt, cut, message):
    encoded = RecordHeader(1, ReqId(2, 3, 4, 5), 6, TIME).encode(fmt)
    with pytest.raises(MalformedMessage, match=message):
        RecordHeader.read(Reader(encoded[:cut]), fmt)


@BOTH_FORMATS
@given(record=RECORDS)
def test_record_round_trip(fmt, record):
    encoded = record.encode(fmt)
    q = record.req_id
    assert encoded == wire_record(
        record.transaction_id,
        (q.client_id, q.generation, q.partition_id, q.seq),
        record.header,
        record.data,
        version=fmt.version,
        timestamp=record.timestamp,
    )
    assert len(encoded) == HEAD_BYTES[fmt.version] + len(record.data) + CRC_BYTES
    r = Reader(encoded)
    assert Record.read(r, fmt=fmt) == (record if fmt.version >= 2 else untimed(record))
    assert r.remaining == 0


# --- Record.read validation (either format) -----------------------------------------------


@BOTH_FORMATS
def test_record_read_rejects_negative_data_length(fmt):
    raw = wire_record(7, (1, 2, 3, 4), 0, b"", length=-1, version=fmt.version)
    with pytest.raises(MalformedMessage, match=r"Record.data length -1 is outside 0\.\.16777216"):
        Record.read(Reader(raw), fmt=fmt)


@BOTH_FORMATS
def test_record_read_rejects_data_length_over_the_bound(fmt):
    raw = wire_record(7, (1, 2, 3, 4), 0, b"x" * 11, version=fmt.version)
    with pytest.raises(MalformedMessage, match=r"Record.data length 11 is outside 0\.\.10"):
        Record.read(Reader(raw), max_data_bytes=10, fmt=fmt)
    assert Record.read(Reader(raw), max_data_bytes=11, fmt=fmt).data == b"x" * 11


@BOTH_FORMATS
def test_record_read_rejects_data_running_past_the_buffer(fmt):
    raw = wire_record(7, (1, 2, 3, 4), 0, b"abc", length=1000, version=fmt.version)
    at = HEAD_BYTES[fmt.version]  # the data starts after the head
    with pytest.raises(MalformedMessage, match=rf"Record.data: needs 1000 bytes at offset {at},"):
        Record.read(Reader(raw), fmt=fmt)


@BOTH_FORMATS
def test_record_read_rejects_missing_checksum(fmt):
    raw = wire_record(7, (1, 2, 3, 4), 0, b"abc", version=fmt.version)[:-1]
    with pytest.raises(MalformedMessage, match=r"Record.checksum: needs 4 bytes .* only 3 left"):
        Record.read(Reader(raw), fmt=fmt)


@BOTH_FORMATS
@pytest.mark.parametrize("cut", [0, 1, 8, 31])
def test_record_read_rejects_truncated_head(fmt, cut):
    raw = wire_record(7, (1, 2, 3, 4), 0, b"abc", version=fmt.version)[:cut]
    with pytest.raises(MalformedMessage, match=r"needs \d+ bytes at offset \d+, only \d+ left"):
        Record.read(Reader(raw), fmt=fmt)


@pytest.mark.parametrize("cut", [32, 35, 39])
def test_record_read_rejects_a_format_2_head_cut_in_its_commit_time(cut):
    raw = wire_record(7, (1, 2, 3, 4), 0, b"abc", version=2)[:cut]
    with pytest.raises(
        MalformedMessage, match=rf"^Record.timestamp: needs 8 bytes at offset 32, only {cut - 32}"
    ):
        Record.read(Reader(raw), fmt=FORMAT_2)


@BOTH_FORMATS
def test_record_read_rejects_bad_checksum(fmt):
    raw = wire_record(42, (1, 2, 3, 4), 0, b"abc", crc=0xDEADBEEF, version=fmt.version)
    with pytest.raises(
        ChecksumMismatch, match=r"transaction 42: data CRC-32 0x352441c2 != sent 0xdeadbeef"
    ):
        Record.read(Reader(raw), fmt=fmt)


def test_a_record_read_in_the_other_format_is_refused():
    """The format decides where the data starts: a record read in the wrong one fails."""
    rec = Record(7, ReqId(1, 2, 3, 4), 0, b"abcdefgh", TIME)
    with pytest.raises(MalformedMessage):
        Record.read(Reader(rec.encode(FORMAT_2)), fmt=FORMAT_1)
    with pytest.raises(MalformedMessage):
        Record.read(Reader(rec.encode(FORMAT_1)), fmt=FORMAT_2)


def test_checksum_mismatch_is_a_malformed_message():
    assert issubclass(ChecksumMismatch, MalformedMessage)
    assert issubclass(MalformedMessage, ProtocolError)


# --- RecordBatch ---------------------------------------------------------------------------


@BOTH_FORMATS
def test_empty_batch(fmt):
    batch = RecordBatch.from_records([], fmt)
    assert batch.format is fmt
    assert len(batch) == 0
    assert batch.buf == b""
    assert batch.spans == []
    assert batch.data_bytes == 0
    assert list(batch.records()) == []
    assert list(batch.headers()) == []
    assert batch.timestamps() == []
    assert repr(batch) == "RecordBatch(empty)"
    assert RecordBatch.read(Reader(b""), 0, fmt=fmt) == batch


@BOTH_FORMATS
@given(records=RECORD_LISTS)
def test_batch_from_records_is_consistent(fmt, records):
    batch = RecordBatch.from_records(records, fmt)
    assert batch.format is fmt
    assert len(batch) == len(records)
    assert batch.buf == b"".join(rec.encode(fmt) for rec in records)
    assert batch.buf == hand_built(records, fmt.version)
    read = as_read(records, fmt.version)
    assert list(batch.records()) == read
    assert list(batch.headers()) == [
        RecordHeader(rec.transaction_id, rec.req_id, rec.header, rec.timestamp) for rec in read
    ]
    assert batch.timestamps() == [rec.timestamp for rec in read]
    assert batch.data_bytes == sum(len(rec.data) for rec in records)
    if records:
        assert batch.first_txid == records[0].transaction_id
        assert batch.last_txid == records[-1].transaction_id
        assert repr(batch) == (
            f"RecordBatch({len(records)} records, "
            f"txid {records[0].transaction_id}..{records[-1].transaction_id})"
        )
    else:
        assert repr(batch) == "RecordBatch(empty)"


@BOTH_FORMATS
@given(records=RECORD_LISTS)
def test_batch_spans_point_at_each_record(fmt, records):
    batch = RecordBatch.from_records(records, fmt)
    head = HEAD_BYTES[fmt.version]
    offset = 0
    for rec, (txid, pos, length) in zip(records, batch.spans, strict=True):
        assert (txid, pos, length) == (rec.transaction_id, offset, len(rec.data))
        # The span's offset is the record's head; its data follows the 32- or 40-byte head.
        assert struct.unpack_from(">q", batch.buf, pos)[0] == txid
        assert struct.unpack_from(">i", batch.buf, pos + 28)[0] == length
        if fmt.version >= 2:
            assert struct.unpack_from(">q", batch.buf, pos + 32)[0] == rec.timestamp
        assert batch.buf[pos + head : pos + head + length] == rec.data
        crc_at = pos + head + length
        assert struct.unpack_from(">I", batch.buf, crc_at)[0] == zlib.crc32(rec.data)
        offset = crc_at + CRC_BYTES
    assert offset == len(batch.buf)


@BOTH_FORMATS
@given(records=RECORD_LISTS)
def test_batch_read_matches_from_records(fmt, records):
    built = RecordBatch.from_records(records, fmt)
    r = Reader(built.buf)
    read = RecordBatch.read(r, len(records), fmt=fmt)
    assert r.remaining == 0
    assert read == built
    assert read.format is fmt
    assert read.spans == built.spans
    assert list(read.records()) == as_read(records, fmt.version)
    assert list(read.headers()) == list(built.headers())
    assert read.timestamps() == built.timestamps()
    assert isinstance(read.buf, bytes)


@BOTH_FORMATS
@given(records=RECORD_LISTS, prefix=st.binary(min_size=1, max_size=40))
def test_batch_read_starts_at_the_cursor(fmt, records, prefix):
    built = RecordBatch.from_records(records, fmt)
    r = Reader(prefix + built.buf, pos=len(prefix))
    read = RecordBatch.read(r, len(records), fmt=fmt)
    assert read == built and read.spans == built.spans


def test_batch_equality_is_by_bytes_and_format():
    a = RecordBatch.from_records([Record(1, ReqId(0, 0, 0, 0), 0, b"a")])
    b = RecordBatch.from_records([Record(1, ReqId(0, 0, 0, 0), 0, b"a")])
    c = RecordBatch.from_records([Record(1, ReqId(0, 0, 0, 0), 0, b"b")])
    assert a == b
    assert a != c
    assert a != a.buf
    # The same records in the other format; the same bytes labelled another format.
    assert a != RecordBatch.from_records([Record(1, ReqId(0, 0, 0, 0), 0, b"a")], FORMAT_1)
    assert a != RecordBatch(a.buf, a.spans, FORMAT_1)
    assert a == RecordBatch(a.buf, a.spans, FORMAT_2)


# --- RecordBatch.read validation (either format) -------------------------------------------


@BOTH_FORMATS
@pytest.mark.parametrize("short", [10, 1], ids=["10-bytes", "head-minus-1"])
def test_batch_read_rejects_truncated_head(fmt, short):
    head = HEAD_BYTES[fmt.version]
    raw = wire_record(1, (0, 0, 0, 0), 0, b"ab", version=fmt.version)
    raw += b"\x00" * (10 if short == 10 else head - 1)
    at = head + 2 + CRC_BYTES  # where the second record starts
    with pytest.raises(MalformedMessage, match=rf"record 1 of 2: truncated head at offset {at}$"):
        RecordBatch.read(Reader(raw), 2, fmt=fmt)


@BOTH_FORMATS
def test_batch_read_rejects_more_records_than_present(fmt):
    with pytest.raises(MalformedMessage, match=r"record 0 of 3: truncated head at offset 0"):
        RecordBatch.read(Reader(b""), 3, fmt=fmt)


@BOTH_FORMATS
def test_batch_read_rejects_negative_data_length(fmt):
    raw = wire_record(5, (0, 0, 0, 0), 0, b"", length=-7, version=fmt.version)
    with pytest.raises(
        MalformedMessage, match=r"record 0 \(transaction 5\): data length -7 is outside 0\.\."
    ):
        RecordBatch.read(Reader(raw), 1, fmt=fmt)


@BOTH_FORMATS
def test_batch_read_rejects_data_length_over_the_bound(fmt):
    raw = wire_record(5, (0, 0, 0, 0), 0, b"", version=fmt.version) + wire_record(
        6, (0, 0, 0, 0), 0, b"x" * 9, version=fmt.version
    )
    with pytest.raises(
        MalformedMessage, match=r"record 1 \(transaction 6\): data length 9 is outside 0\.\.8"
    ):
        RecordBatch.read(Reader(raw), 2, max_data_bytes=8, fmt=fmt)
    assert len(RecordBatch.read(Reader(raw), 2, max_data_bytes=9, fmt=fmt)) == 2


@BOTH_FORMATS
def test_batch_read_rejects_the_default_bound_plus_one_without_allocating(fmt):
    raw = wire_record(
        5, (0, 0, 0, 0), 0, b"", length=DEFAULT_MAX_DATA_BYTES + 1, version=fmt.version
    )
    with pytest.raises(MalformedMessage, match=r"data length 16777217 is outside 0\.\.16777216"):
        RecordBatch.read(Reader(raw), 1, fmt=fmt)


@BOTH_FORMATS
@pytest.mark.parametrize("length", [3, 4, 5, 1000, 2**31 - 1])
def test_batch_read_rejects_data_running_past_the_frame(fmt, length):
    # 3 data bytes are present, the 4-byte CRC cut off: any length of 3 or more overruns.
    raw = wire_record(9, (0, 0, 0, 0), 0, b"abc", length=length, version=fmt.version)[:-4]
    with pytest.raises(
        MalformedMessage, match=rf"record 0 \(transaction 9\): data length {length} runs past"
    ):
        RecordBatch.read(Reader(raw), 1, max_data_bytes=2**31 - 1, fmt=fmt)


@BOTH_FORMATS
def test_batch_read_rejects_bad_checksum_naming_the_transaction(fmt):
    raw = wire_record(1, (0, 0, 0, 0), 0, b"ok", version=fmt.version) + wire_record(
        2, (0, 0, 0, 0), 0, b"abc", crc=0x12345678, version=fmt.version
    )
    with pytest.raises(
        ChecksumMismatch, match=r"transaction 2: data CRC-32 0x352441c2 != sent 0x12345678"
    ):
        RecordBatch.read(Reader(raw), 2, fmt=fmt)


@BOTH_FORMATS
@pytest.mark.parametrize("count", [0, 1])
def test_batch_read_rejects_trailing_bytes(fmt, count):
    raw = wire_record(1, (0, 0, 0, 0), 0, b"ok", version=fmt.version)
    if count == 0:
        expected = rf"record list: {len(raw)} trailing bytes after 0 records"
    else:
        raw += b"\x00\x01"
        expected = r"record list: 2 trailing bytes after 1 records"
    with pytest.raises(MalformedMessage, match=expected):
        RecordBatch.read(Reader(raw), count, fmt=fmt)


def test_batch_read_in_the_other_format_is_refused():
    records = [
        Record(10, ReqId(1, 2, 3, 4), 0, b"abc", TIME),
        Record(11, ReqId(1, 2, 3, 5), 0, b""),
    ]
    with pytest.raises(MalformedMessage):
        RecordBatch.read(Reader(RecordBatch.from_records(records, FORMAT_1).buf), 2, fmt=FORMAT_2)
    with pytest.raises(MalformedMessage):
        RecordBatch.read(Reader(RecordBatch.from_records(records, FORMAT_2).buf), 2, fmt=FORMAT_1)


@BOTH_FORMATS
@given(records=st.lists(RECORDS, min_size=1, max_size=5), data=st.data())
def test_batch_read_detects_any_corrupted_data_or_crc_byte(fmt, records, data):
    batch = RecordBatch.from_records(records, fmt)
    head = HEAD_BYTES[fmt.version]
    index = data.draw(st.integers(0, len(records) - 1), label="record")
    _, pos, length = batch.spans[index]
    # Any byte of the record's data or of its CRC.
    at = data.draw(st.integers(pos + head, pos + head + length + CRC_BYTES - 1))
    flip = data.draw(st.integers(1, 255), label="xor")
    raw = bytearray(batch.buf)
    raw[at] ^= flip
    txid = records[index].transaction_id
    with pytest.raises(ChecksumMismatch, match=rf"^transaction {txid}: data CRC-32"):
        RecordBatch.read(Reader(bytes(raw)), len(records), fmt=fmt)


@BOTH_FORMATS
@given(records=RECORD_LISTS, data=st.data())
def test_batch_read_on_mutated_bytes_only_raises_protocol_errors(fmt, records, data):
    raw = bytearray(RecordBatch.from_records(records, fmt).buf)
    for _ in range(data.draw(st.integers(1, 4), label="mutations")):
        op = data.draw(st.sampled_from(["flip", "cut", "insert"]), label="op")
        at = data.draw(st.integers(0, len(raw)), label="at")
        if op == "flip" and at < len(raw):
            raw[at] ^= data.draw(st.integers(1, 255), label="xor")
        elif op == "cut":
            del raw[at : at + data.draw(st.integers(1, 40), label="n")]
        else:
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=8), label="bytes")
    count = data.draw(st.integers(0, 25), label="count")
    try:
        batch = RecordBatch.read(Reader(bytes(raw)), count, max_data_bytes=4096, fmt=fmt)
    except ProtocolError:
        return
    assert len(batch) == count
    assert RecordBatch.from_records(list(batch.records()), fmt) == batch


# --- timestamps, convert --------------------------------------------------------------------


def test_timestamps_are_each_records_commit_time():
    times = [TIME, NO_TIMESTAMP, 0, 2**63 - 1, -(2**63)]
    raw = b"".join(
        wire_record(100 + i, (1, 2, 3, i), 0, b"x" * i, version=2, timestamp=t)
        for i, t in enumerate(times)
    )
    batch = RecordBatch.read(Reader(raw), len(times), fmt=FORMAT_2)
    assert batch.timestamps() == times
    assert [rec.timestamp for rec in batch.records()] == times
    assert [h.timestamp for h in batch.headers()] == times


def test_timestamps_of_format_1_are_none_known():
    raw = b"".join(wire_record(100 + i, (1, 2, 3, i), 0, b"x" * i) for i in range(3))
    batch = RecordBatch.read(Reader(raw), 3, fmt=FORMAT_1)
    assert batch.timestamps() == [NO_TIMESTAMP] * 3
    assert [rec.timestamp for rec in batch.records()] == [NO_TIMESTAMP] * 3


@given(RECORD_LISTS)
def test_convert_format_1_to_2_gives_no_timestamp(records):
    old = RecordBatch.from_records(records, FORMAT_1)
    new = old.convert(FORMAT_2)
    assert new.format is FORMAT_2
    assert new.buf == hand_built([untimed(rec) for rec in records], 2)
    assert list(new.records()) == [untimed(rec) for rec in records]
    assert new.timestamps() == [NO_TIMESTAMP] * len(records)
    assert new.spans == RecordBatch.read(Reader(new.buf), len(records), fmt=FORMAT_2).spans
    assert old.format is FORMAT_1 and old.buf == hand_built(records, 1)  # left as it was


@given(RECORD_LISTS)
def test_convert_format_2_to_1_drops_the_times(records):
    new = RecordBatch.from_records(records, FORMAT_2)
    old = new.convert(FORMAT_1)
    assert old.format is FORMAT_1
    assert old.buf == hand_built(records, 1)
    assert list(old.records()) == [untimed(rec) for rec in records]
    assert old.spans == RecordBatch.read(Reader(old.buf), len(records), fmt=FORMAT_1).spans
    assert new.format is FORMAT_2 and new.buf == hand_built(records, 2)  # left as it was
    # And back: the same records, without their times.
    assert old.convert(FORMAT_2) == RecordBatch.from_records(
        [untimed(rec) for rec in records], FORMAT_2
    )


@BOTH_FORMATS
def test_convert_to_its_own_format_is_the_batch_itself(fmt):
    batch = RecordBatch.from_records([Record(1, ReqId(0, 0, 0, 0), 0, b"a", TIME)], fmt)
    assert batch.convert(fmt) is batch
    assert RecordBatch.from_records([], fmt).convert(fmt).format is fmt


# --- UncheckedRecords --------------------------------------------------------------------


RECORDS_TO_CHECK = [
    Record(10, ReqId(1, 2, 3, 4), 0, b"abc", TIME),
    Record(11, ReqId(1, 2, 3, 5), 7, b"", TIME + 1),
]


@BOTH_FORMATS
@pytest.mark.parametrize("view", [False, True], ids=["bytes", "memoryview"])
def test_unchecked_records_check_in_their_format(fmt, view):
    batch = RecordBatch.from_records(RECORDS_TO_CHECK, fmt)
    buf = memoryview(b"xx" + batch.buf)[2:] if view else batch.buf
    unchecked = UncheckedRecords(buf, 2, fmt)
    assert unchecked.format is fmt
    assert len(unchecked) == 2
    assert (unchecked.first_txid, unchecked.last_txid) == (10, 11)
    checked = unchecked.check()
    assert checked.format is fmt
    assert checked == batch and checked.spans == batch.spans
    assert list(checked.records()) == as_read(RECORDS_TO_CHECK, fmt.version)
    assert unchecked.format is fmt  # checking does not change it
    with pytest.raises(MalformedMessage, match=r"record 0 \(transaction 10\): data length 3 is"):
        unchecked.check(max_data_bytes=2)


def test_unchecked_records_check_reads_in_their_format_not_the_default():
    old = RecordBatch.from_records(RECORDS_TO_CHECK, FORMAT_1)
    with pytest.raises(MalformedMessage):
        UncheckedRecords(old.buf, 2).check()  # taken for format 2: the heads are wrong
    assert UncheckedRecords(old.buf, 2, FORMAT_1).check() == old
    new = RecordBatch.from_records(RECORDS_TO_CHECK)
    assert UncheckedRecords(new.buf, 2).check() == new
    with pytest.raises(MalformedMessage):
        UncheckedRecords(new.buf, 2, FORMAT_1).check()


def test_unchecked_records_without_a_record():
    assert UncheckedRecords(b"", 0).first_txid is None
    assert UncheckedRecords(b"", 0).last_txid is None
    assert UncheckedRecords(b"1234567", 1).first_txid is None  # too short for an ID
    assert UncheckedRecords(b"", 0, FORMAT_1).check() == RecordBatch(b"", [], FORMAT_1)
