"""One segment of a partition's log: ``<first txid>.seg`` (records) and ``.idx`` (offsets).

The byte layout of both files is in ``segment_format.py``. Each segment holds records of
the record format its header names: new segments that of this build (``DEFAULT_FORMAT``),
segments an older node left format 1, read as they are (never rewritten) and served in
``DEFAULT_FORMAT`` like the others.

The ``.seg`` file of the segment being appended to grows ahead of its records in
zero-filled steps (``PREALLOCATE_STEP``); the zeros after the last record are free
space, not part of the log; a clean close cuts them off, and so does the next open
after a crash.

The ``.idx`` file holds one i64 record offset per transaction after its
header. Records are fdatasync'd before an append is acknowledged; index entries
are written after each data fsync (and before the acknowledgement) and fsync'd every
``INDEX_CHECKPOINT`` entries. A write that finds no room (records, index entries, a new
segment's files) raises ``OutOfSpace``: the caller undoes the append (``truncate_after``
with ``write_index=False``) and the next one that fits goes on.

On open every record is checked (``scan_records``) and the index only serves as
evidence of which records were synced; ``recovery.py`` makes the decisions,
``Segment.from_scan`` applies them.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import struct
import time
import uuid
from array import array
from collections.abc import Callable

from waltz_client.runtime.files import fsync_directory
from waltz_client.wire.crc import crc32 as fast_crc32
from waltz_client.wire.native import native
from waltz_client.wire.records import (
    DEFAULT_FORMAT,
    FORMAT_1,
    NO_TIMESTAMP,
    RecordBatch,
    RecordFormat,
)

from .errors import CorruptSegment, TransactionNotFound, out_of_space
from .group_sync import WriteBack
from .index_offsets import IndexedOffsets
from .segment_format import (
    CRC,
    DATA_LENGTH,
    HEADER_BYTES,
    RECORD_OVERHEAD,
    check_record,
    cut_short,
    disk_head_bytes,
    disk_overhead,
    encode_header,
    record_format_of,
    segment_stem,
    segment_version,
)
from .segment_scan import Damage, SegmentScan

log = logging.getLogger(__name__)

INDEX_CHECKPOINT = 1000
SCAN_CHUNK_BYTES = 4 * 1024 * 1024
LAST_TXID = 2**63 - 1  # the largest i64: the compiled scan leaves it to the Python loop
# An append into blocks the file already has changes neither its size nor its block map,
# so the fdatasync that makes it durable writes the data and flushes the disk, with no
# filesystem journal commit (PostgreSQL and BookKeeper zero-fill their logs ahead for the
# same reason). fallocate would not do: its unwritten extents still need a journal commit
# on first write. Measured here (docs/benchmarks.md): 1 partition at C=16, +12%.
PREALLOCATE_STEP = 1024 * 1024  # zero bytes written at a time
PREALLOCATE_AHEAD = 1024 * 1024  # a new step once the zeros ahead of the records are fewer
# A larger write group gets no zeros after it: its sync is mostly the data's own, and the
# next such group would overwrite the zeros at once (1 MiB groups: -17% with them).
ZEROS_FOR_WRITES_UNDER = 256 * 1024
_ZEROS = memoryview(bytes(PREALLOCATE_STEP))


def end_of_data(fd: int, start: int, size: int) -> int:
    """The offset after the last non-zero byte of the file between ``start`` and ``size``
    (``start`` if there is none): where the zero-filled space after the records begins."""
    end = size
    while end > start:
        chunk = min(SCAN_CHUNK_BYTES, end - start)
        kept = len(os.pread(fd, chunk, end - chunk).rstrip(b"\x00"))
        if kept:
            return end - chunk + kept
        end -= chunk
    return start


def wire_to_disk(batch: RecordBatch, start: int, stop: int, out: bytearray) -> list[int]:
    """Append records ``start..stop`` of a wire batch to ``out`` in disk layout (the
    batch's record format: its head, the data CRC, the data, the head's CRC).

    Returns each record's length on disk. Data CRCs were verified on decode.
    """
    head_size = batch.format.head_size
    if native is not None and type(batch.spans) is list:
        return native.wire_to_disk(batch.buf, batch.spans, start, stop, out, head_size)
    buf = batch.buf
    mv = memoryview(buf)
    crc_fn = fast_crc32
    sizes = []
    overhead = head_size + 2 * CRC.size
    for _, pos, length in batch.spans[start:stop]:
        data_start = pos + head_size
        data_end = data_start + length
        head = buf[pos:data_start] + buf[data_end : data_end + 4]  # the head + data crc
        out += head
        out += mv[data_start:data_end]
        out += CRC.pack(crc_fn(head))
        sizes.append(length + overhead)
    return sizes


_HEAD_CHECKED = struct.Struct(">q20xi")  # a head's txid and data length
_COMMIT_TIME = struct.Struct(">q")  # at offset 32 of a format-2 head


def disk_to_wire(
    buf: bytes, first_txid: int, ends: list[int], source: str, fmt: RecordFormat = FORMAT_1
) -> RecordBatch:
    """Verify the disk records in ``buf`` (of record format ``fmt``) and convert them to
    a wire batch.

    ``ends[i]`` is where record ``first_txid + i`` ends in ``buf`` (from the index), so
    the loop knows every record's extent without reading it first; a record whose
    length disagrees with the index is corrupt like one that fails its checksums.
    """
    head_size = fmt.head_size
    if native is not None:
        converted = native.disk_to_wire(buf, first_txid, ends, head_size)
        if converted is not None:
            return RecordBatch(*converted, fmt)
    # The hot loop of every read where the compiled one is missing, and what names the
    # problem where it found one: one unpack and two CRCs a record, locals only. On any
    # doubt, check_record says precisely what is wrong.
    parts: list[memoryview] = []
    add = parts.extend
    spans: list[tuple[int, int, int]] = []
    span = spans.append
    mv = memoryview(buf)
    head = _HEAD_CHECKED.unpack_from
    stored_crc = CRC.unpack_from
    crc32 = fast_crc32
    disk_head = head_size + CRC.size
    pos = out_pos = 0
    txid = first_txid
    for end in ends:
        recorded_txid, length = head(buf, pos)
        data = pos + disk_head
        data_end = end - 4
        if (
            recorded_txid != txid
            or length < 0
            or data + length != data_end
            or crc32(mv[pos:data]) != stored_crc(buf, data_end)[0]
            or crc32(mv[data:data_end]) != stored_crc(buf, pos + head_size)[0]
        ):
            problem = check_record(buf, pos, txid, fmt) or (
                f"the index puts its end at offset {end}, its head says {data_end + 4}"
            )
            raise CorruptSegment(f"{source}: transaction {txid} at offset {pos}: {problem}")
        add((mv[pos : pos + head_size], mv[data:data_end], mv[pos + head_size : data]))
        span((txid, out_pos, length))
        out_pos += disk_head + length
        txid += 1
        pos = end
    return RecordBatch(b"".join(parts), spans, fmt)


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
        allocated: int | None = None,
        fmt: RecordFormat = DEFAULT_FORMAT,
    ) -> None:
        self.directory = directory
        self.format = fmt  # of its records, as its header says
        self.partition_id = partition_id
        self.cluster_key = cluster_key
        self.first_txid = first_txid
        # Named once: every read passes the data file's name along, for its errors.
        stem = os.path.join(directory, segment_stem(first_txid))
        self.data_path = stem + ".seg"
        self.index_path = stem + ".idx"
        self._data_fd = data_fd
        self._index_fd = index_fd
        # offsets[i] = file offset of transaction first_txid + i: in memory while the segment
        # can change, in its index file once sealed (release_offsets).
        self.offsets: array | IndexedOffsets = offsets
        self.size = size  # bytes of the header and records in the data file
        # The data file's length: the records, then zeros written ahead of them.
        self._allocated = size if allocated is None else max(allocated, size)
        self._preallocate_from = size  # no new zeros before the records reach this
        self.created_ms = created_ms
        self._index_written = len(offsets)  # entries written to the .idx file
        self._index_synced = len(offsets)  # entries fsync'd in the .idx file
        self._dirty = False  # data written since the last fsync
        self._synced_size = size  # the records before this offset are durable
        # The file length (and its blocks) as of the last fdatasync of this segment: records
        # written below it overwrite durable zeros, so writing their pages back is enough
        # to read them after a crash. 0 until this process syncs it itself.
        self._durable_length = 0
        self.device = os.fstat(data_fd).st_dev
        self._last_time: tuple[int, int] | None = None  # (last txid, its commit time)

    # --- naming -------------------------------------------------------------------------

    @property
    def count(self) -> int:
        return len(self.offsets)

    @property
    def last_txid(self) -> int:
        return self.first_txid + len(self.offsets) - 1

    def __repr__(self) -> str:
        return (
            f"Segment({self.data_path}, txid {self.first_txid}..{self.last_txid}, "
            f"format {self.format.version})"
        )

    # --- create / open ------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        directory: str,
        partition_id: int,
        cluster_key: uuid.UUID,
        first_txid: int,
        fmt: RecordFormat = DEFAULT_FORMAT,
    ) -> Segment:
        """New empty segment for records of ``fmt`` (another than this build's only as an
        older node left them: tests): both files written with their header and fsync'd,
        then the dir. Files of that name are overwritten."""
        created_ms = int(time.time() * 1000)
        version = segment_version(fmt)
        header = encode_header(cluster_key, partition_id, first_txid, created_ms, version)
        stem = os.path.join(directory, segment_stem(first_txid))
        fds: list[int] = []
        try:
            for suffix in (".idx", ".seg"):
                fds.append(os.open(stem + suffix, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644))
                _write_all(fds[-1], header, 0)
                os.fsync(fds[-1])
            fsync_directory(directory)
        except OSError as e:
            # A roll on a full disk: leave no half-made segment behind (the next roll, or
            # the next open, would find one), and say whether the disk was full.
            for fd in fds:
                os.close(fd)
            for suffix in (".idx", ".seg")[: len(fds)]:
                with contextlib.suppress(OSError):
                    os.unlink(stem + suffix)
            raise out_of_space(e, f"creating {stem}.seg") from e
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
            fmt=fmt,
        )

    @classmethod
    def from_scan(
        cls, directory: str, partition_id: int, cluster_key: uuid.UUID, scan: SegmentScan
    ) -> Segment:
        """Open a segment that recovery has scanned and accepted.

        A torn tail the scan found (``scan.damage``, accepted by the caller) is cut
        and the index is made to hold exactly one entry per record, fsync'd.
        """
        stem = os.path.join(directory, segment_stem(scan.first_txid))
        data_fd = os.open(stem + ".seg", os.O_RDWR)
        try:
            index_fd = os.open(stem + ".idx", os.O_RDWR | os.O_CREAT, 0o644)
        except BaseException:
            os.close(data_fd)
            raise
        try:
            # A sealed segment whose index the scan found exact reads its offsets from it.
            offsets: array | IndexedOffsets = (
                IndexedOffsets(index_fd, scan.indexed_records, HEADER_BYTES, stem + ".idx")
                if scan.in_index
                else array("q", scan.offsets)
            )
        except BaseException:
            os.close(data_fd)
            os.close(index_fd)
            raise
        segment = cls(
            directory,
            partition_id,
            cluster_key,
            scan.first_txid,
            data_fd,
            index_fd,
            offsets,
            scan.size,
            scan.created_ms,
            fmt=record_format_of(scan.version),
        )
        try:
            if scan.damage is not None:
                segment._cut_torn_tail(scan.damage)
            elif os.fstat(data_fd).st_size > scan.size:  # zeros a crash left after the records
                os.ftruncate(data_fd, scan.size)
                os.fsync(data_fd)
            if scan.in_index:
                segment._cut_index_to(scan.indexed_records)
            else:
                segment._rewrite_index(scan)
        except BaseException:
            segment.close()
            raise
        return segment

    def _cut_index_to(self, count: int) -> None:
        """The index holds exactly ``count`` whole entries: drop a part-written one after
        them, if any (as ``_rewrite_index`` does)."""
        length = HEADER_BYTES + 8 * count
        if os.fstat(self._index_fd).st_size > length:
            os.ftruncate(self._index_fd, length)
            os.fsync(self._index_fd)

    def _cut_torn_tail(self, damage: Damage) -> None:
        log.warning(
            "%s: cutting %d bytes of torn tail; the log now ends at transaction %d",
            damage.where,
            damage.cut,
            damage.txid - 1,
        )
        os.ftruncate(self._data_fd, damage.offset)
        os.fsync(self._data_fd)
        self.size = self._allocated = self._synced_size = damage.offset

    def _rewrite_index(self, scan: SegmentScan) -> None:
        """Make the .idx file hold exactly ``self.offsets``; fsync it. Entries that already
        match the records stay as they are."""
        if scan.index_note is not None:
            log.warning("%s: %s; rebuilding it from the records", self.index_path, scan.index_note)
            os.ftruncate(self._index_fd, 0)
            os.pwrite(self._index_fd, scan.header, 0)
        keep = common_prefix(scan.hints, self.offsets)
        if keep == len(self.offsets) < len(scan.hints):
            # The last record, synced, cut off by the end of the file: recovery lets one
            # such entry pass (like a cut short last record) and refuses more.
            log.warning(
                "%s: %d entries past the last record (transaction %d), whose records are "
                "not in the file; dropping them",
                self.index_path,
                len(scan.hints) - keep,
                self.last_txid,
            )
        elif keep < len(scan.hints):
            log.info("%s: entries from %d on disagree with the records", self.index_path, keep)
        os.ftruncate(self._index_fd, HEADER_BYTES + 8 * keep)
        if len(self.offsets) > keep:
            entries = array("q", self.offsets[keep:])
            entries.byteswap()  # big-endian on disk
            os.pwrite(self._index_fd, entries.tobytes(), HEADER_BYTES + 8 * keep)
        os.fsync(self._index_fd)
        self._index_written = self._index_synced = len(self.offsets)

    # --- writes -------------------------------------------------------------------------

    def write_batch(
        self, batch: RecordBatch, start: int, stop: int, zeros_until: int = 2**62
    ) -> None:
        """Write records ``start..stop`` of ``batch``, which must be in this segment's
        record format, after the last (no fsync); see ``write``."""
        if batch.format.version != self.format.version:
            raise ValueError(
                f"{self}: a batch of record format {batch.format.version} cannot be "
                f"written to a segment of format {self.format.version}"
            )
        out = bytearray()
        sizes = wire_to_disk(batch, start, stop, out)
        self.write(out, sizes, zeros_until)

    def write(
        self, data: bytes | bytearray, record_sizes: list[int], zeros_until: int = 2**62
    ) -> None:
        """Write whole records after the last (no fsync), one offset per record size; then
        zeros ahead of them, up to offset ``zeros_until`` (where the segment will roll)."""
        start = self.size
        try:
            _write_all(self._data_fd, data, start)
        except OSError as e:
            # Leave no partial record behind; the caller answers with an I/O error.
            os.ftruncate(self._data_fd, start)
            self._allocated = start
            self._durable_length = min(self._durable_length, start)
            raise out_of_space(e, f"writing records to {self.data_path}") from e
        pos = start
        offsets = self.offsets  # the active segment's: in memory (truncate_after sees to it)
        assert isinstance(offsets, array)
        for n in record_sizes:
            offsets.append(pos)
            pos += n
        self.size = pos
        self._allocated = max(self._allocated, pos)
        self._dirty = True
        if (
            len(data) < ZEROS_FOR_WRITES_UNDER
            and self._allocated - pos < PREALLOCATE_AHEAD
            and pos >= self._preallocate_from
        ):
            self._preallocate(min(PREALLOCATE_STEP, zeros_until - self._allocated))

    def _preallocate(self, count: int) -> None:
        """Write ``count`` zeros after the end of the file; the next sync makes them
        durable with the records. Only a speed-up: on a full disk the file ends at its
        records, appends extend it, and the next try waits for another step of records."""
        if count <= 0:
            return
        try:
            self._allocated += os.pwrite(self._data_fd, _ZEROS[:count], self._allocated)
        except OSError as e:
            self._preallocate_from = self.size + PREALLOCATE_STEP
            log.info("%s: cannot write zeros ahead of the records (%s)", self.data_path, e)

    @property
    def overwrites_durable_blocks(self) -> bool:
        """Were the records written since the last sync all written over zeros that an
        fdatasync of this segment made durable (its length and blocks)? Then writing
        their pages back and a flush of the disk make them durable: no metadata changed."""
        return self.size <= self._durable_length

    def write_back(self, write_back: WriteBack, flags: int) -> None:
        """sync_file_range over the records written since the last sync (no flush)."""
        if self.size > self._synced_size and (
            write_back(self._data_fd, self._synced_size, self.size - self._synced_size, flags) != 0
        ):
            code = ctypes.get_errno()
            raise OSError(code, f"writing back {self.data_path}: {os.strerror(code)}")

    def flush_data(self) -> None:
        """fdatasync the data file: its records, its length and blocks, then the disk."""
        length = self._allocated
        os.fdatasync(self._data_fd)
        self._durable_length = length

    def sync(self, sync_data: Callable[[int], None] | None = None) -> None:
        """fsync the data (through ``sync_data``: the node's group sync), then write new
        index entries; fsync the index at each checkpoint. ``OutOfSpace`` when the index
        has no room for its new entries: the records are durable but not acknowledged
        yet, and the caller undoes them (an fsync's error is never retried)."""
        if self._dirty:
            # fdatasync still commits a size or block change when the zeros ran out.
            if sync_data is None:
                self.flush_data()
            else:
                sync_data(self._data_fd)
            self._dirty = False
            self._synced_size = self.size
        count = len(self.offsets)
        if count > self._index_written:
            entries = array("q", self.offsets[self._index_written :])
            entries.byteswap()
            try:
                # Extending the index needs a new block every 512 entries, so it can
                # find a full disk after the records found room in their zeros.
                _write_all(
                    self._index_fd, entries.tobytes(), HEADER_BYTES + 8 * self._index_written
                )
            except OSError as e:
                raise out_of_space(e, f"writing the index {self.index_path}") from e
            self._index_written = count
            if count // INDEX_CHECKPOINT > self._index_synced // INDEX_CHECKPOINT:
                os.fsync(self._index_fd)
                self._index_synced = count

    def seal(self) -> None:
        """Make data and the whole index durable and cut the zeros after the records
        (before a new segment starts)."""
        self.sync()
        if self._allocated > self.size:
            os.ftruncate(self._data_fd, self.size)
            os.fsync(self._data_fd)
            self._allocated = self.size
            self._durable_length = min(self._durable_length, self.size)
        if self._index_synced < len(self.offsets):
            os.fsync(self._index_fd)
            self._index_synced = len(self.offsets)

    def release_offsets(self) -> None:
        """A sealed segment: read its offsets from its index file from now on, not from
        memory. Only once the file holds every offset, fsync'd; else they stay here."""
        offsets = self.offsets
        if not isinstance(offsets, array) or self._dirty or not offsets:
            return
        if not self._index_written == self._index_synced == len(offsets):
            return
        try:
            indexed = IndexedOffsets(self._index_fd, len(offsets), HEADER_BYTES, self.index_path)
            ends = (indexed[0], indexed[-1])
        except (OSError, ValueError, CorruptSegment) as e:
            log.warning("%s: keeping its offsets in memory: %s", self.index_path, e)
            return
        if ends != (offsets[0], offsets[-1]):
            log.warning("%s: its entries disagree with the records; kept in memory", self)
            return
        self.offsets = indexed

    def _own_offsets(self) -> array:
        """The offsets in memory again (a sealed segment about to change)."""
        offsets = self.offsets
        if isinstance(offsets, IndexedOffsets):
            self.offsets = offsets = offsets.to_array()
        return offsets

    def truncate_after(self, txid: int, *, write_index: bool = True) -> None:
        """Drop every record after ``txid`` (``first_txid - 1`` empties the segment); fsync.

        ``write_index=False`` (undoing an append on a full disk) only cuts: index entries
        of the records kept that were not yet in the file are left for the next sync."""
        self._own_offsets()
        keep = txid - self.first_txid + 1
        if keep < 0:
            raise ValueError(f"transaction {txid} is before {self}")
        if keep >= len(self.offsets):
            return
        new_size = self.offsets[keep]
        # The index first: after a crash in between, index entries past the end of the data
        # would read as synced records gone missing, records past the index are just rescanned.
        self._index_written = min(self._index_written, keep)
        os.ftruncate(self._index_fd, HEADER_BYTES + 8 * self._index_written)
        os.fsync(self._index_fd)
        os.ftruncate(self._data_fd, new_size)
        os.fsync(self._data_fd)
        del self.offsets[keep:]
        self.size = self._allocated = self._synced_size = new_size
        self._durable_length = min(self._durable_length, new_size)
        self._dirty = False
        if not write_index:
            self._index_synced = self._index_written  # the cut index was fsync'd above
            return
        self.sync()  # rewrites any entries that were not yet in the file
        os.fsync(self._index_fd)
        self._index_synced = len(self.offsets)

    # --- reads --------------------------------------------------------------------------

    def _span(
        self, txid: int, max_records: int, max_bytes: int, grow: int = 0
    ) -> tuple[int, int, int, array]:
        """(start offset, end offset, count, the records' offsets) of up to ``max_records``
        records from ``txid``, at most ``max_bytes`` with ``grow`` bytes added a record."""
        i = txid - self.first_txid
        n = len(self.offsets)
        if not 0 <= i < n:
            raise TransactionNotFound(f"transaction {txid} is not in {self}")
        # The entries this read can use, in one slice (one pread for a sealed segment): a
        # record takes at least RECORD_OVERHEAD bytes, so no more than that many fit.
        stop = max(i + 1, min(n, i + max_records, i + max_bytes // RECORD_OVERHEAD + 1))
        entries = self.offsets[i : stop + 1]  # the entry at stop, if any, ends the last
        start = entries[0]

        def end_of(k: int) -> int:
            return entries[k - i] if k < n else self.size

        # Always at least one record; then as many as fit in max_bytes.
        while stop > i + 1 and end_of(stop) - start + grow * (stop - i) > max_bytes:
            stop = i + 1 + (stop - i - 1) // 2
        end = end_of(stop)
        if not HEADER_BYTES <= start < end <= self.size:  # a damaged index entry
            raise CorruptSegment(
                f"{self.index_path}: transaction {txid}'s records are at offsets {start} to "
                f"{end}, outside the records ({HEADER_BYTES} to {self.size})"
            )
        return start, end, stop - i, entries[: stop - i]

    def read_batch(self, txid: int, max_records: int, max_bytes: int) -> RecordBatch:
        """Up to ``max_records`` records from ``txid``, checked, in ``DEFAULT_FORMAT``
        (a format-1 segment's converted: their times are ``NO_TIMESTAMP``); at most
        ``max_bytes`` of them (at least one)."""
        fmt = self.format
        # A record on the wire in DEFAULT_FORMAT takes this much more than on disk here.
        grow = max(0, DEFAULT_FORMAT.head_size + CRC.size - disk_overhead(fmt))
        start, end, _, offsets = self._span(txid, max_records, max_bytes, grow)
        buf = os.pread(self._data_fd, end - start, start)
        if len(buf) != end - start:
            raise CorruptSegment(
                f"{self.data_path}: {len(buf)} bytes at offset {start} where the index "
                f"says {end - start} (the file was cut short)"
            )
        ends = [offset - start for offset in offsets[1:]]
        ends.append(end - start)
        batch = disk_to_wire(buf, txid, ends, self.data_path, fmt)
        return batch if fmt.version == DEFAULT_FORMAT.version else batch.convert(DEFAULT_FORMAT)

    # --- commit times ---------------------------------------------------------------------

    def commit_time(self, txid: int) -> int:
        """The commit time of ``txid`` as its head says (NO_TIMESTAMP in a format-1
        segment). One pread of 8 bytes: a search's probe, not a checked read (what the
        search finds is read, and checked, by the reads that follow it)."""
        if self.format.version < 2:
            return NO_TIMESTAMP
        offset = self.offsets[txid - self.first_txid] + self.format.head_size - _COMMIT_TIME.size
        raw = os.pread(self._data_fd, _COMMIT_TIME.size, offset)
        if len(raw) != _COMMIT_TIME.size:
            raise CorruptSegment(f"{self.data_path}: transaction {txid}'s head is cut short")
        time_ms: int = _COMMIT_TIME.unpack(raw)[0]
        return time_ms

    def last_commit_time(self) -> int:
        """The commit time of the last record (NO_TIMESTAMP: none, or format 1). A sealed
        segment's never changes: kept after the first look."""
        if not self.count:
            return NO_TIMESTAMP
        cached = self._last_time
        if cached is not None and cached[0] == self.last_txid:
            return cached[1]
        time_ms = self.commit_time(self.last_txid)
        self._last_time = (self.last_txid, time_ms)
        return time_ms

    def first_at_or_after(self, time_ms: int, from_txid: int) -> int:
        """The first transaction from ``from_txid`` committed at or after ``time_ms``; the
        last + 1 if none. Commit times never decrease along a log (a record without one
        counts as earlier than any), so a binary search over the records' heads."""
        lo, hi = max(from_txid, self.first_txid), self.last_txid + 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self.commit_time(mid) >= time_ms:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def read_raw(self, txid: int, max_records: int, max_bytes: int) -> tuple[bytes, int]:
        """Raw disk bytes (in the segment's format) of up to ``max_records`` records and
        how many there are."""
        start, end, count, _ = self._span(txid, max_records, max_bytes)
        return os.pread(self._data_fd, end - start, start), count

    def close(self) -> None:
        """Close the files, first cutting the zeros after the records (after a crash, the
        next open cuts them)."""
        if self._data_fd >= 0 and self._allocated > self.size:
            try:
                os.ftruncate(self._data_fd, self.size)
            except OSError as e:
                log.warning("%s: cannot cut the zeros after the records: %s", self.data_path, e)
        if isinstance(self.offsets, IndexedOffsets):
            self.offsets.forget_file()
        for fd in (self._data_fd, self._index_fd):
            if fd >= 0:
                os.close(fd)
        self._data_fd = self._index_fd = -1


def _write_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    """pwrite all of ``data`` at ``offset``: after a short write (a full disk fills in the
    middle of it), the next call says why."""
    done = os.pwrite(fd, data, offset)
    if done == len(data):  # the usual case: all at once, no view
        return
    view = memoryview(data)
    if done <= 0:
        raise OSError(f"short write: 0 of {len(view)} bytes")
    while done < len(view):
        written = os.pwrite(fd, view[done:], offset + done)
        if written <= 0:
            raise OSError(f"short write: {done} of {len(view)} bytes")
        done += written


def common_prefix(a: array, b: array) -> int:
    """How many leading entries ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def read_index(path: str, data_header: bytes) -> tuple[array, str | None]:
    """The whole entries of a .idx file (read-only), or none and why (missing, other header)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return array("q"), "missing"
    if data[:HEADER_BYTES] != data_header:
        return array("q"), "header does not match its data file"
    entries = array("q")
    entries.frombytes(data[HEADER_BYTES : HEADER_BYTES + (len(data) - HEADER_BYTES) // 8 * 8])
    entries.byteswap()
    return entries, None


def scan_segment_file(
    fd: int, size: int, first_txid: int, fmt: RecordFormat = FORMAT_1
) -> tuple[array, int, str | None, int]:
    """``scan_records`` from the header to ``size``, taking the zeros written ahead of the
    records as free space: (offsets, where the valid records stop, why they stop there or
    None at the end of the records, where the file's non-zero bytes end). ``fmt``: the
    segment's record format (``record_format_of`` its header's version)."""
    offsets, pos, problem = scan_records(fd, HEADER_BYTES, size, first_txid, fmt)
    if problem is None:
        return offsets, pos, None, pos
    end = end_of_data(fd, pos, size)
    return offsets, pos, problem if end > pos else None, end


def scan_records(
    fd: int, pos: int, size: int, expected_txid: int, fmt: RecordFormat = FORMAT_1
) -> tuple[array, int, str | None]:
    """Check every record (of record format ``fmt``) from ``pos``: (their offsets, where
    the valid records stop, and why they stop there: ``check_record``'s problem, or None
    at the end of the file).

    Reads ``SCAN_CHUNK_BYTES`` at a time; a record larger than that is read whole.
    """
    offsets = array("q")
    crc32 = fast_crc32
    txid_and_length = _HEAD_CHECKED.unpack_from
    crc_at = CRC.unpack_from
    head_size = fmt.head_size  # the wire head; the data CRC follows it
    head_bytes = disk_head_bytes(fmt)
    overhead = disk_overhead(fmt)
    while pos < size:
        buf = os.pread(fd, min(SCAN_CHUNK_BYTES, size - pos), pos)
        n = len(buf)
        mv = memoryview(buf)
        rel = 0
        while n - rel >= head_bytes:
            if native is not None and expected_txid < LAST_TXID:
                # Past every whole, valid record at once; the loop below takes the one
                # it stopped before (cut off by the chunk, or wrong: it says what).
                rel, expected_txid, found = native.scan_disk(
                    buf, rel, expected_txid, pos, head_size
                )
                offsets.frombytes(found)
                if n - rel < head_bytes:
                    break
            txid, length = txid_and_length(buf, rel)
            data = rel + head_bytes
            end = data + length
            if length < 0 or end + 4 > n:
                break
            if (
                txid != expected_txid
                or crc32(mv[rel:data]) != crc_at(buf, end)[0]
                or crc32(mv[data:end]) != crc_at(buf, rel + head_size)[0]
            ):
                return offsets, pos + rel, check_record(mv[: end + 4], rel, expected_txid, fmt)
            offsets.append(pos + rel)
            expected_txid += 1
            rel = end + 4
        if rel:
            pos += rel
            continue
        # The record at pos does not fit in the chunk: read it whole, or find it cut short.
        head = buf if n >= head_bytes else os.pread(fd, head_bytes, pos)
        if len(head) < head_bytes:
            return offsets, pos, check_record(head, 0, expected_txid, fmt)
        (length,) = DATA_LENGTH.unpack_from(head, 0)
        if length < 0 or pos + overhead + length > size:
            return offsets, pos, cut_short(length, size - pos - head_bytes)
        problem = check_record(os.pread(fd, overhead + length, pos), 0, expected_txid, fmt)
        if problem is not None:
            return offsets, pos, problem
        offsets.append(pos)
        expected_txid += 1
        pos += overhead + length
    return offsets, pos, None
