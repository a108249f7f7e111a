"""ReqId, RecordHeader, Record and RecordBatch: byte layout, round trips, validation."""

from __future__ import annotations

import random
import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from waltz_client.wire.buffers import Reader
from waltz_client.wire.errors import ChecksumMismatch, MalformedMessage, ProtocolError
from waltz_client.wire.records import (
    DEFAULT_MAX_DATA_BYTES,
    Record,
    RecordBatch,
    RecordHeader,
    ReqId,
    crc32,
)

I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)

# Transaction data up to ~2 KiB. Large payloads come from a seeded PRNG so a
# batch of 20 of them does not exhaust hypothesis' entropy buffer.
DATA = st.one_of(
    st.binary(max_size=64),
    st.builds(lambda n, seed: random.Random(seed).randbytes(n), st.integers(0, 2048), I64),
)
REQ_IDS = st.builds(ReqId, I32, I32, I32, I32)
HEADERS = st.builds(RecordHeader, I64, REQ_IDS, I32)
RECORDS = st.builds(Record, I64, REQ_IDS, I32, DATA)
RECORD_LISTS = st.lists(RECORDS, max_size=20)

HEAD_BYTES = 32  # i64 txid, 4 x i32 ReqId, i32 header, i32 data length
CRC_BYTES = 4


def wire_record(txid, req, header, data, length=None, crc=None) -> bytes:
    """A record built by hand, independently of the code under test."""
    return (
        struct.pack(
            ">qiiiiii",
            txid,
            req[0],
            req[1],
            req[2],
            req[3],
            header,
            len(data) if length is None else length,
        )
        + data
        + struct.pack(">I", zlib.crc32(data) if crc is None else crc)
    )


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


# --- ReqId / RecordHeader / Record layouts ------------------------------------------------


def test_req_id_layout():
    assert ReqId(1, 2, 3, 4).encode() == bytes.fromhex("00000001 00000002 00000003 00000004")
    assert ReqId(-1, 0, 0, 0).encode()[:4] == b"\xff\xff\xff\xff"


def test_record_header_layout():
    encoded = RecordHeader(0x0102030405060708, ReqId(9, 10, 11, 12), -2).encode()
    assert encoded == bytes.fromhex("0102030405060708 00000009 0000000a 0000000b 0000000c fffffffe")
    assert len(encoded) == 28


def test_record_layout():
    record = Record(1, ReqId(2, 3, 4, 5), 6, b"abc")
    assert record.encode() == bytes.fromhex(
        "0000000000000001 00000002 00000003 00000004 00000005 00000006 00000003616263 352441c2"
    )
    assert record.checksum == 0x352441C2


@given(REQ_IDS)
def test_req_id_round_trip(req):
    r = Reader(req.encode())
    assert ReqId.read(r) == req
    assert r.remaining == 0


@given(HEADERS)
def test_record_header_round_trip(header):
    encoded = header.encode()
    q = header.req_id
    assert encoded == struct.pack(
        ">qiiiii",
        header.transaction_id,
        q.client_id,
        q.generation,
        q.partition_id,
        q.seq,
        header.header,
    )
    r = Reader(encoded)
    assert RecordHeader.read(r) == header
    assert r.remaining == 0


@given(RECORDS)
def test_record_round_trip(record):
    encoded = record.encode()
    q = record.req_id
    assert encoded == wire_record(
        record.transaction_id,
        (q.client_id, q.generation, q.partition_id, q.seq),
        record.header,
        record.data,
    )
    assert len(encoded) == HEAD_BYTES + len(record.data) + CRC_BYTES
    r = Reader(encoded)
    assert Record.read(r) == record
    assert r.remaining == 0


# --- Record.read validation ---------------------------------------------------------------


def test_record_read_rejects_negative_data_length():
    raw = wire_record(7, (1, 2, 3, 4), 0, b"", length=-1)
    with pytest.raises(MalformedMessage, match=r"Record.data length -1 is outside 0\.\.16777216"):
        Record.read(Reader(raw))


def test_record_read_rejects_data_length_over_the_bound():
    raw = wire_record(7, (1, 2, 3, 4), 0, b"x" * 11)
    with pytest.raises(MalformedMessage, match=r"Record.data length 11 is outside 0\.\.10"):
        Record.read(Reader(raw), max_data_bytes=10)
    assert Record.read(Reader(raw), max_data_bytes=11).data == b"x" * 11


def test_record_read_rejects_data_running_past_the_buffer():
    raw = wire_record(7, (1, 2, 3, 4), 0, b"abc", length=1000)
    with pytest.raises(MalformedMessage, match=r"Record.data: needs 1000 bytes at offset 32"):
        Record.read(Reader(raw))


def test_record_read_rejects_missing_checksum():
    raw = wire_record(7, (1, 2, 3, 4), 0, b"abc")[:-1]
    with pytest.raises(MalformedMessage, match=r"Record.checksum: needs 4 bytes .* only 3 left"):
        Record.read(Reader(raw))


@pytest.mark.parametrize("cut", [0, 1, 8, 31])
def test_record_read_rejects_truncated_head(cut):
    raw = wire_record(7, (1, 2, 3, 4), 0, b"abc")[:cut]
    with pytest.raises(MalformedMessage, match=r"needs \d+ bytes at offset \d+, only \d+ left"):
        Record.read(Reader(raw))


def test_record_read_rejects_bad_checksum():
    raw = wire_record(42, (1, 2, 3, 4), 0, b"abc", crc=0xDEADBEEF)
    with pytest.raises(
        ChecksumMismatch, match=r"transaction 42: data CRC-32 0x352441c2 != sent 0xdeadbeef"
    ):
        Record.read(Reader(raw))


def test_checksum_mismatch_is_a_malformed_message():
    assert issubclass(ChecksumMismatch, MalformedMessage)
    assert issubclass(MalformedMessage, ProtocolError)


# --- RecordBatch ---------------------------------------------------------------------------


def test_empty_batch():
    batch = RecordBatch.from_records([])
    assert len(batch) == 0
    assert batch.buf == b""
    assert batch.spans == []
    assert batch.data_bytes == 0
    assert list(batch.records()) == []
    assert list(batch.headers()) == []
    assert repr(batch) == "RecordBatch(empty)"
    assert RecordBatch.read(Reader(b""), 0) == batch


@given(RECORD_LISTS)
def test_batch_from_records_is_consistent(records):
    batch = RecordBatch.from_records(records)
    assert len(batch) == len(records)
    assert batch.buf == b"".join(rec.encode() for rec in records)
    assert list(batch.records()) == records
    assert list(batch.headers()) == [
        RecordHeader(rec.transaction_id, rec.req_id, rec.header) for rec in records
    ]
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


@given(RECORD_LISTS)
def test_batch_spans_point_at_each_record(records):
    batch = RecordBatch.from_records(records)
    offset = 0
    for rec, (txid, pos, length) in zip(records, batch.spans, strict=True):
        assert (txid, pos, length) == (rec.transaction_id, offset, len(rec.data))
        # The span's offset is the record's head; its data follows the 32-byte head.
        assert struct.unpack_from(">q", batch.buf, pos)[0] == txid
        assert struct.unpack_from(">i", batch.buf, pos + 28)[0] == length
        assert batch.buf[pos + HEAD_BYTES : pos + HEAD_BYTES + length] == rec.data
        crc_at = pos + HEAD_BYTES + length
        assert struct.unpack_from(">I", batch.buf, crc_at)[0] == zlib.crc32(rec.data)
        offset = crc_at + CRC_BYTES
    assert offset == len(batch.buf)


@given(RECORD_LISTS)
def test_batch_read_matches_from_records(records):
    built = RecordBatch.from_records(records)
    r = Reader(built.buf)
    read = RecordBatch.read(r, len(records))
    assert r.remaining == 0
    assert read == built
    assert read.spans == built.spans
    assert list(read.records()) == records
    assert list(read.headers()) == list(built.headers())
    assert isinstance(read.buf, bytes)


@given(RECORD_LISTS, st.binary(min_size=1, max_size=40))
def test_batch_read_starts_at_the_cursor(records, prefix):
    built = RecordBatch.from_records(records)
    r = Reader(prefix + built.buf, pos=len(prefix))
    read = RecordBatch.read(r, len(records))
    assert read == built and read.spans == built.spans


def test_batch_equality_is_by_bytes():
    a = RecordBatch.from_records([Record(1, ReqId(0, 0, 0, 0), 0, b"a")])
    b = RecordBatch.from_records([Record(1, ReqId(0, 0, 0, 0), 0, b"a")])
    c = RecordBatch.from_records([Record(1, ReqId(0, 0, 0, 0), 0, b"b")])
    assert a == b
    assert a != c
    assert a != a.buf


def test_batch_read_rejects_truncated_head():
    raw = wire_record(1, (0, 0, 0, 0), 0, b"ab") + b"\x00" * 10
    with pytest.raises(MalformedMessage, match=r"record 1 of 2: truncated head at offset 38"):
        RecordBatch.read(Reader(raw), 2)


def test_batch_read_rejects_more_records_than_present():
    with pytest.raises(MalformedMessage, match=r"record 0 of 3: truncated head at offset 0"):
        RecordBatch.read(Reader(b""), 3)


def test_batch_read_rejects_negative_data_length():
    raw = wire_record(5, (0, 0, 0, 0), 0, b"", length=-7)
    with pytest.raises(
        MalformedMessage, match=r"record 0 \(transaction 5\): data length -7 is outside 0\.\."
    ):
        RecordBatch.read(Reader(raw), 1)


def test_batch_read_rejects_data_length_over_the_bound():
    raw = wire_record(5, (0, 0, 0, 0), 0, b"") + wire_record(6, (0, 0, 0, 0), 0, b"x" * 9)
    with pytest.raises(
        MalformedMessage, match=r"record 1 \(transaction 6\): data length 9 is outside 0\.\.8"
    ):
        RecordBatch.read(Reader(raw), 2, max_data_bytes=8)
    assert len(RecordBatch.read(Reader(raw), 2, max_data_bytes=9)) == 2


def test_batch_read_rejects_the_default_bound_plus_one_without_allocating():
    raw = wire_record(5, (0, 0, 0, 0), 0, b"", length=DEFAULT_MAX_DATA_BYTES + 1)
    with pytest.raises(MalformedMessage, match=r"data length 16777217 is outside 0\.\.16777216"):
        RecordBatch.read(Reader(raw), 1)


@pytest.mark.parametrize("length", [3, 4, 5, 1000, 2**31 - 1])
def test_batch_read_rejects_data_running_past_the_frame(length):
    # 3 data bytes and a 4-byte CRC are present: any length above 3 overruns.
    raw = wire_record(9, (0, 0, 0, 0), 0, b"abc", length=length)[:-4]
    with pytest.raises(
        MalformedMessage, match=rf"record 0 \(transaction 9\): data length {length} runs past"
    ):
        RecordBatch.read(Reader(raw), 1, max_data_bytes=2**31 - 1)


def test_batch_read_rejects_bad_checksum_naming_the_transaction():
    raw = wire_record(1, (0, 0, 0, 0), 0, b"ok") + wire_record(
        2, (0, 0, 0, 0), 0, b"abc", crc=0x12345678
    )
    with pytest.raises(
        ChecksumMismatch, match=r"transaction 2: data CRC-32 0x352441c2 != sent 0x12345678"
    ):
        RecordBatch.read(Reader(raw), 2)


@pytest.mark.parametrize("count", [0, 1])
def test_batch_read_rejects_trailing_bytes(count):
    raw = wire_record(1, (0, 0, 0, 0), 0, b"ok")
    if count == 0:
        expected = rf"record list: {len(raw)} trailing bytes after 0 records"
    else:
        raw += b"\x00\x01"
        expected = r"record list: 2 trailing bytes after 1 records"
    with pytest.raises(MalformedMessage, match=expected):
        RecordBatch.read(Reader(raw), count)


@given(st.lists(RECORDS, min_size=1, max_size=5), st.data())
def test_batch_read_detects_any_corrupted_data_or_crc_byte(records, data):
    batch = RecordBatch.from_records(records)
    index = data.draw(st.integers(0, len(records) - 1), label="record")
    _, pos, length = batch.spans[index]
    # Any byte of the record's data or of its CRC.
    at = data.draw(st.integers(pos + HEAD_BYTES, pos + HEAD_BYTES + length + CRC_BYTES - 1))
    flip = data.draw(st.integers(1, 255), label="xor")
    raw = bytearray(batch.buf)
    raw[at] ^= flip
    txid = records[index].transaction_id
    with pytest.raises(ChecksumMismatch, match=rf"^transaction {txid}: data CRC-32"):
        RecordBatch.read(Reader(bytes(raw)), len(records))


@given(RECORD_LISTS, st.data())
def test_batch_read_on_mutated_bytes_only_raises_protocol_errors(records, data):
    raw = bytearray(RecordBatch.from_records(records).buf)
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
        batch = RecordBatch.read(Reader(bytes(raw)), count, max_data_bytes=4096)
    except ProtocolError:
        return
    assert len(batch) == count
    assert RecordBatch.from_records(list(batch.records())) == batch
