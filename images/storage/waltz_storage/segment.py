"""One segment of a partition's log: ``<first txid>.seg`` (records) and ``.idx`` (offsets).

Both files start with the same 128-byte header::

    i32 format version | i64 creation time (ms) | 16-byte cluster key | i32 partition id
    | i64 first transaction id | u32 CRC-32 of the previous 40 bytes | 84 reserved zero bytes

A record in the ``.seg`` file::

    i64 transaction id | ReqId (4 x i32) | i32 header | i32 data length | u32 data CRC-32
    | data | u32 record CRC-32 (of the 36 bytes before the data)

The ``.idx`` file holds one i64 record offset per transaction after its
header. Records are fsync'd before an append is acknowledged; index entries
are written after each data fsync and fsync'd every ``INDEX_CHECKPOINT``
entries, so on open only the entries before the last checkpoint are trusted
and the rest are rebuilt by scanning the records.
"""

from __future__ import annotations

import logging
import os
import struct
import time
import uuid
import zlib
from array import array
from collections.abc import Iterator

from waltz_client.wire.records import WIRE_RECORD_HEAD, RecordBatch

from .control_file import fsync_directory
from .errors import CorruptSegment, TransactionNotFound

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
HEADER_BYTES = 128
_HEADER = struct.Struct(">iq16siq")
_CRC = struct.Struct(">I")
RECORD_HEAD = struct.Struct(">qiiiiiiI")  # txid, reqid(4), header, data length, data crc
RECORD_HEAD_BYTES = RECORD_HEAD.size  # 36
RECORD_OVERHEAD = RECORD_HEAD_BYTES + _CRC.size  # 40 bytes around the data
_OFFSET = struct.Struct(">q")
INDEX_CHECKPOINT = 1000
SCAN_CHUNK_BYTES = 4 * 1024 * 1024


def segment_stem(first_txid: int) -> str:
    return f"{first_txid:019d}"


def encode_header(
    cluster_key: uuid.UUID, partition_id: int, first_txid: int, created_ms: int | None = None
) -> bytes:
    if created_ms is None:
        created_ms = int(time.time() * 1000)
    head = _HEADER.pack(FORMAT_VERSION, created_ms, cluster_key.bytes, partition_id, first_txid)
    return (head + _CRC.pack(zlib.crc32(head))).ljust(HEADER_BYTES, b"\x00")


def decode_header(data: bytes, path: str) -> tuple[int, int, uuid.UUID, int, int]:
    """(version, created ms, cluster key, partition id, first txid); CorruptSegment if bad."""
    if len(data) < HEADER_BYTES:
        raise CorruptSegment(f"{path}: header is {len(data)} bytes, expected {HEADER_BYTES}")
    version, created, key, partition_id, first = _HEADER.unpack_from(data)
    (crc,) = _CRC.unpack_from(data, _HEADER.size)
    if zlib.crc32(data[: _HEADER.size]) != crc:
        raise CorruptSegment(f"{path}: header checksum mismatch")
    if version != FORMAT_VERSION:
        raise CorruptSegment(f"{path}: format version {version} not supported")
    return version, created, uuid.UUID(bytes=key), partition_id, first


def check_record(buf: bytes | memoryview, pos: int, expected_txid: int) -> str | None:
    """Why the record at ``pos`` is not a whole, valid record of ``expected_txid`` (None if it is).

    ``buf`` must extend at least to the record's end for a valid record.
    """
    end = len(buf)
    if end - pos < RECORD_HEAD_BYTES:
        return f"record head cut short ({end - pos} of {RECORD_HEAD_BYTES} bytes)"
    txid, _, _, _, _, _, length, data_crc = RECORD_HEAD.unpack_from(buf, pos)
    head_end = pos + RECORD_HEAD_BYTES
    if end - head_end >= length + 4 and length >= 0:
        (record_crc,) = _CRC.unpack_from(buf, head_end + length)
        head_ok = zlib.crc32(memoryview(buf)[pos:head_end]) == record_crc
    else:
        head_ok = False
    if not head_ok:
        if length < 0 or end - head_end < length + 4:
            return f"record cut short (head says {length} data bytes, {end - head_end} follow)"
        return "record checksum mismatch"
    if txid != expected_txid:
        return f"transaction id {txid} where {expected_txid} was expected"
    if zlib.crc32(memoryview(buf)[head_end : head_end + length]) != data_crc:
        return f"data checksum mismatch in transaction {txid}"
    return None


def wire_to_disk(batch: RecordBatch, start: int, stop: int, out: bytearray) -> list[int]:
    """Append records ``start..stop`` of a wire batch to ``out`` in disk layout.

    Returns each record's length on disk. Data CRCs were verified on decode.
    """
    buf = batch.buf
    mv = memoryview(buf)
    crc_fn = zlib.crc32
    sizes = []
    head_size = WIRE_RECORD_HEAD.size  # 32
    for _, pos, length in batch.spans[start:stop]:
        data_start = pos + head_size
        data_end = data_start + length
        head = buf[pos:data_start] + buf[data_end : data_end + 4]  # 32-byte head + data crc
        out += head
        out += mv[data_start:data_end]
        out += _CRC.pack(crc_fn(head))
        sizes.append(length + RECORD_OVERHEAD)
    return sizes


def disk_to_wire(buf: bytes, first_txid: int, count: int, source: str) -> RecordBatch:
    """Verify ``count`` disk records in ``buf`` and convert them to a wire batch."""
    parts: list[bytes | memoryview] = []
    spans: list[tuple[int, int, int]] = []
    mv = memoryview(buf)
    pos = 0
    out_pos = 0
    for i in range(count):
        txid = first_txid + i
        problem = check_record(buf, pos, txid)
        if problem is not None:
            raise CorruptSegment(f"{source}: transaction {txid} at offset {pos}: {problem}")
        length = RECORD_HEAD.unpack_from(buf, pos)[6]
        head_end = pos + RECORD_HEAD_BYTES
        parts.append(mv[pos : pos + 32])
        parts.append(mv[head_end : head_end + length])
        parts.append(mv[pos + 32 : head_end])
        spans.append((txid, out_pos, length))
        out_pos += 36 + length
        pos = head_end + length + 4
    return RecordBatch(b"".join(parts), spans)


class Segment:
    """An open segment. Not thread-safe: one partition's requests run in order."""

    def __init__(
        self,
        directory: str,
        partition_id: int,
        cluster_key: uuid.UUID,
        first_txid: int,
        data_fd: int,
        index_fd: int,
        offsets: array,
        size: int,
        created_ms: int,
    ) -> None:
        self.directory = directory
        self.partition_id = partition_id
        self.cluster_key = cluster_key
        self.first_txid = first_txid
        self._data_fd = data_fd
        self._index_fd = index_fd
        self.offsets = offsets  # offsets[i] = file offset of transaction first_txid + i
        self.size = size  # bytes in the data file, header included
        self.created_ms = created_ms
        self._index_written = len(offsets)  # entries written to the .idx file
        self._index_synced = len(offsets)  # entries fsync'd in the .idx file
        self._dirty = False  # data written since the last fsync

    # --- naming -------------------------------------------------------------------------

    @property
    def data_path(self) -> str:
        return os.path.join(self.directory, segment_stem(self.first_txid) + ".seg")

    @property
    def index_path(self) -> str:
        return os.path.join(self.directory, segment_stem(self.first_txid) + ".idx")

    @property
    def count(self) -> int:
        return len(self.offsets)

    @property
    def last_txid(self) -> int:
        return self.first_txid + len(self.offsets) - 1

    def __repr__(self) -> str:
        return f"Segment({self.data_path}, txid {self.first_txid}..{self.last_txid})"

    # --- create / open ------------------------------------------------------------------

    @classmethod
    def create(
        cls, directory: str, partition_id: int, cluster_key: uuid.UUID, first_txid: int
    ) -> Segment:
        """New empty segment: both files written with their header and fsync'd, then the dir."""
        created_ms = int(time.time() * 1000)
        header = encode_header(cluster_key, partition_id, first_txid, created_ms)
        stem = os.path.join(directory, segment_stem(first_txid))
        fds = []
        for suffix in (".idx", ".seg"):
            fd = os.open(stem + suffix, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(fd, header)
            os.fsync(fd)
            fds.append(fd)
        fsync_directory(directory)
        return cls(
            directory,
            partition_id,
            cluster_key,
            first_txid,
            fds[1],
            fds[0],
            array("q"),
            HEADER_BYTES,
            created_ms,
        )

    @classmethod
    def open(
        cls,
        directory: str,
        partition_id: int,
        cluster_key: uuid.UUID,
        first_txid: int,
        *,
        is_last: bool,
        max_torn_bytes: int,
    ) -> Segment:
        """Open and recover a segment.

        The index is trusted up to its last checkpoint (checked by reading the
        record its last trusted entry points at) and rebuilt past it by
        scanning. In the last segment, damage within ``max_torn_bytes`` of
        the end of the file is a torn tail (the last write group, never
        acknowledged) and is cut; damage anywhere else is corruption, and the
        segment refuses to open.
        """
        stem = os.path.join(directory, segment_stem(first_txid))
        data_path = stem + ".seg"
        data_fd = os.open(data_path, os.O_RDWR)
        try:
            header = os.pread(data_fd, HEADER_BYTES, 0)
            size = os.fstat(data_fd).st_size
            if len(header) < HEADER_BYTES and is_last:
                # Torn creation: the header is fsync'd before any record is written.
                log.warning(
                    "%s: %d-byte header from an interrupted creation; recreating",
                    data_path,
                    len(header),
                )
                os.close(data_fd)
                data_fd = -1
                return cls.create(directory, partition_id, cluster_key, first_txid)
            _, created, key, stored_partition, stored_first = decode_header(header, data_path)
            if key != cluster_key:
                raise CorruptSegment(
                    f"{data_path}: belongs to cluster {str(key)[:8]}..., "
                    f"not {str(cluster_key)[:8]}..."
                )
            if stored_partition != partition_id or stored_first != first_txid:
                raise CorruptSegment(
                    f"{data_path}: header says partition {stored_partition} first transaction "
                    f"{stored_first}, file name says partition {partition_id} first {first_txid}"
                )
            index_fd, offsets, hints = _open_index(stem + ".idx", header, data_fd, size, first_txid)
            segment = cls(
                directory,
                partition_id,
                cluster_key,
                first_txid,
                data_fd,
                index_fd,
                offsets,
                size,
                created,
            )
            segment._recover_tail(is_last=is_last, max_torn_bytes=max_torn_bytes, hints=hints)
            return segment
        except BaseException:
            if data_fd >= 0:
                os.close(data_fd)
            raise

    def _recover_tail(self, *, is_last: bool, max_torn_bytes: int, hints: array) -> None:
        """Scan records after the trusted index entries; cut a torn tail or refuse corruption.

        A damaged record (bad checksum, or cut short by the end of the file) is a
        torn tail, to be cut, only when it is within ``max_torn_bytes`` of the end
        and no index entry shows it was synced (or it is the last record, cut short).
        ``hints`` are the index entries past the last
        checkpoint: not durable, but an entry is written only after its record's
        fsync, so an entry that points at the damaged record proves the record was
        acknowledged, and damage to it is corruption.
        """
        trusted = len(self.offsets)
        if trusted:
            pos = self.offsets[-1]
            length = RECORD_HEAD.unpack(os.pread(self._data_fd, RECORD_HEAD_BYTES, pos))[6]
            pos += length + RECORD_OVERHEAD
        else:
            pos = HEADER_BYTES
        expected = self.first_txid + trusted
        problem = None
        for txid, offset, record_len, problem in _scan(self._data_fd, pos, self.size, expected):
            if problem is not None:
                pos = offset
                expected = txid
                break
            self.offsets.append(offset)
            pos = offset + record_len
        if problem is None:
            if self.size != pos:  # pragma: no cover - _scan always reports a short tail
                problem = "trailing bytes"
            else:
                self._rewrite_index(trusted)
                return
        cut = self.size - pos
        where = (
            f"partition {self.partition_id} segment {os.path.basename(self.data_path)}: "
            f"{problem} at offset {pos} (transaction {expected})"
        )
        if not is_last:
            raise CorruptSegment(f"{where}; a segment before the last cannot have a torn tail")
        k = expected - self.first_txid - trusted  # the damaged record's position in hints
        synced = (
            0 <= k < len(hints)
            and hints[k] == pos
            and all(hints[j] == self.offsets[trusted + j] for j in range(k))
        )
        cut_short = problem.startswith(("record head cut short", "record cut short"))
        # A synced record cut short by the end of the file, with no later index entry, is
        # still a tail (the file itself was cut); anything else synced is corruption.
        if synced and not (cut_short and k == len(hints) - 1):
            raise CorruptSegment(
                f"{where}: the index shows this record was synced (acknowledged), so this is "
                f"corruption, not a torn write; refusing to open (inspect with "
                f"`waltz storage verify`)"
            )
        if cut > max_torn_bytes:
            raise CorruptSegment(
                f"{where} with {cut} bytes after it, more than one write group "
                f"({max_torn_bytes} bytes) could leave unsynced: this is corruption, not a torn "
                f"write; refusing to open (inspect with `waltz storage verify`)"
            )
        log.warning(
            "%s: cutting %d bytes of torn tail; the log now ends at transaction %d",
            where,
            cut,
            expected - 1,
        )
        os.ftruncate(self._data_fd, pos)
        os.fsync(self._data_fd)
        self.size = pos
        self._rewrite_index(trusted)

    def _rewrite_index(self, trusted: int) -> None:
        """Make the .idx file hold exactly ``self.offsets``; fsync it."""
        keep = HEADER_BYTES + 8 * trusted
        os.ftruncate(self._index_fd, keep)
        if len(self.offsets) > trusted:
            entries = array("q", self.offsets[trusted:])
            entries.byteswap()  # big-endian on disk
            os.pwrite(self._index_fd, entries.tobytes(), keep)
        os.fsync(self._index_fd)
        self._index_written = self._index_synced = len(self.offsets)

    # --- writes -------------------------------------------------------------------------

    def write(self, data: bytes | bytearray, record_sizes: list[int]) -> None:
        """Write whole records at the end of the file (no fsync), one offset per record size."""
        start = self.size
        try:
            written = os.pwrite(self._data_fd, data, start)
            if written != len(data):
                raise OSError(f"short write: {written} of {len(data)} bytes")
        except OSError:
            # Leave no partial record behind; the caller answers with an I/O error.
            os.ftruncate(self._data_fd, start)
            raise
        pos = start
        offsets = self.offsets
        for n in record_sizes:
            offsets.append(pos)
            pos += n
        self.size = pos
        self._dirty = True

    def sync(self) -> None:
        """fsync the data, then write new index entries; fsync the index at each checkpoint."""
        if self._dirty:
            os.fsync(self._data_fd)
            self._dirty = False
        count = len(self.offsets)
        if count > self._index_written:
            entries = array("q", self.offsets[self._index_written :])
            entries.byteswap()
            os.pwrite(self._index_fd, entries.tobytes(), HEADER_BYTES + 8 * self._index_written)
            self._index_written = count
            if count // INDEX_CHECKPOINT > self._index_synced // INDEX_CHECKPOINT:
                os.fsync(self._index_fd)
                self._index_synced = count

    def seal(self) -> None:
        """Make data and the whole index durable (before a new segment starts)."""
        self.sync()
        if self._index_synced < len(self.offsets):
            os.fsync(self._index_fd)
            self._index_synced = len(self.offsets)

    def truncate_after(self, txid: int) -> None:
        """Drop every record after ``txid`` (``first_txid - 1`` empties the segment); fsync."""
        keep = txid - self.first_txid + 1
        if keep < 0:
            raise ValueError(f"transaction {txid} is before {self}")
        if keep >= len(self.offsets):
            return
        new_size = self.offsets[keep]
        os.ftruncate(self._data_fd, new_size)
        os.fsync(self._data_fd)
        del self.offsets[keep:]
        self.size = new_size
        self._dirty = False
        self._index_written = min(self._index_written, keep)
        os.ftruncate(self._index_fd, HEADER_BYTES + 8 * self._index_written)
        self.sync()  # rewrites any entries that were not yet in the file
        os.fsync(self._index_fd)
        self._index_synced = len(self.offsets)

    # --- reads --------------------------------------------------------------------------

    def _span(self, txid: int, max_records: int, max_bytes: int) -> tuple[int, int, int]:
        """(start offset, end offset, count) of up to ``max_records`` records from ``txid``."""
        i = txid - self.first_txid
        if not 0 <= i < len(self.offsets):
            raise TransactionNotFound(f"transaction {txid} is not in {self}")
        offsets = self.offsets
        stop = min(len(offsets), i + max(max_records, 1))
        start = offsets[i]

        def end_of(k: int) -> int:
            return offsets[k] if k < len(offsets) else self.size

        # Always at least one record; then as many as fit in max_bytes.
        while stop > i + 1 and end_of(stop) - start > max_bytes:
            stop = i + 1 + (stop - i - 1) // 2
        return start, end_of(stop), stop - i

    def read_batch(self, txid: int, max_records: int, max_bytes: int) -> RecordBatch:
        start, end, count = self._span(txid, max_records, max_bytes)
        buf = os.pread(self._data_fd, end - start, start)
        return disk_to_wire(buf, txid, count, self.data_path)

    def read_raw(self, txid: int, max_records: int, max_bytes: int) -> tuple[bytes, int]:
        """Raw disk bytes of up to ``max_records`` records and how many there are."""
        start, end, count = self._span(txid, max_records, max_bytes)
        return os.pread(self._data_fd, end - start, start), count

    def close(self) -> None:
        for fd in (self._data_fd, self._index_fd):
            if fd >= 0:
                os.close(fd)
        self._data_fd = self._index_fd = -1


def _open_index(
    path: str, data_header: bytes, data_fd: int, data_size: int, first_txid: int
) -> tuple[int, array, array]:
    """Open (or recreate) the .idx file.

    Returns its fd, the trusted offsets (up to the last checkpoint, checked against
    the record the last one points at) and the entries after them, as hints.
    """
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        log.warning("%s: missing; rebuilding the index from the records", path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        header = os.pread(fd, HEADER_BYTES, 0)
        if header != data_header:
            if header:
                log.warning("%s: header does not match its data file; rebuilding", path)
            os.ftruncate(fd, 0)
            os.pwrite(fd, data_header, 0)
            os.fsync(fd)
            return fd, array("q"), array("q")
        entries = (os.fstat(fd).st_size - HEADER_BYTES) // 8
        trusted = entries // INDEX_CHECKPOINT * INDEX_CHECKPOINT
        every = array("q")
        every.frombytes(os.pread(fd, 8 * entries, HEADER_BYTES))
        every.byteswap()
        offsets = every[:trusted]
        if trusted and not _index_entry_valid(data_fd, data_size, offsets, first_txid):
            log.warning("%s: checkpointed entries do not match the records; rebuilding", path)
            return fd, array("q"), every
        return fd, offsets, every[trusted:]
    except BaseException:
        os.close(fd)
        raise


def _index_entry_valid(data_fd: int, data_size: int, offsets: array, first_txid: int) -> bool:
    """Does the last trusted entry point at a whole, valid record of the right transaction?"""
    pos = offsets[-1]
    if not HEADER_BYTES <= pos <= data_size - RECORD_OVERHEAD:
        return False
    if any(offsets[k] >= offsets[k + 1] for k in range(len(offsets) - 1)):
        return False
    head = os.pread(data_fd, RECORD_HEAD_BYTES, pos)
    length = RECORD_HEAD.unpack(head)[6]
    if length < 0 or pos + RECORD_OVERHEAD + length > data_size:
        return False
    record = os.pread(data_fd, RECORD_OVERHEAD + length, pos)
    return check_record(record, 0, first_txid + len(offsets) - 1) is None


def _scan(
    fd: int, pos: int, size: int, expected_txid: int
) -> Iterator[tuple[int, int, int, str | None]]:
    """Walk records from ``pos``: yields (txid, offset, length, None) per valid record,
    then (expected txid, offset, 0, problem) at the first bad one, if any."""
    buf = b""
    buf_start = pos  # file offset of buf[0]
    while pos < size:
        rel = pos - buf_start
        need = RECORD_HEAD_BYTES
        if len(buf) - rel >= RECORD_HEAD_BYTES:
            length = RECORD_HEAD.unpack_from(buf, rel)[6]
            if length >= 0:
                need = RECORD_OVERHEAD + length
        if len(buf) - rel < need and buf_start + len(buf) < size:
            # Refill: keep the unread part, read at least enough for this record.
            buf = buf[rel:] + os.pread(fd, max(SCAN_CHUNK_BYTES, need), buf_start + len(buf))
            buf_start = pos
            continue
        problem = check_record(
            memoryview(buf)[: rel + need] if len(buf) - rel >= need else buf, rel, expected_txid
        )
        if problem is not None:
            yield expected_txid, pos, 0, problem
            return
        length = RECORD_HEAD.unpack_from(buf, rel)[6]
        yield expected_txid, pos, RECORD_OVERHEAD + length, None
        pos += RECORD_OVERHEAD + length
        expected_txid += 1
