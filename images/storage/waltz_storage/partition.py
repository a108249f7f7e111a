"""A partition's log on one storage node: its segments, appends, truncation and reads.

Records are taken and served in this build's record format (``DEFAULT_FORMAT``, with
commit times). Segments an older node wrote (format 1, without them) stay as they are:
they are read, truncated and deleted like any, and served converted; the first append
after such a segment starts a new segment of ``DEFAULT_FORMAT`` (``_roll``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections.abc import Callable

from waltz_client.runtime.files import fsync_directory
from waltz_client.wire.native import native
from waltz_client.wire.records import DEFAULT_FORMAT, RecordBatch, RecordHeader

from .control_file import NO_TRANSACTION
from .errors import NonContiguousAppend, PartitionRefused, TransactionNotFound, TruncateRefused
from .log_start import leftover_segments, read_log_start, write_log_start
from .recovery import SEGMENT_NAME, refusal, scan_partition
from .segment import Segment
from .segment_format import disk_bytes_bound, disk_overhead, segment_stem

log = logging.getLogger(__name__)

_OVERHEAD = disk_overhead(DEFAULT_FORMAT)  # a record's bytes on disk beyond its data

DEFAULT_SEGMENT_BYTES = 1024 * 1024 * 1024
# One write group with the default limits (8 MiB group + one 64 MiB frame; on disk at most
# 4/3 of that: an older server's records of format 1 grow from 36 to 48 bytes): 96 MiB.
DEFAULT_MAX_TORN_BYTES = disk_bytes_bound(72 * 1024 * 1024)


class PartitionLog:
    """The ordered segments of one partition. Not thread-safe: callers serialise."""

    def __init__(
        self,
        directory: str,
        partition_id: int,
        cluster_key: uuid.UUID,
        segments: list[Segment],
        segment_bytes: int,
        log_start: int = 0,
    ) -> None:
        self.directory = directory
        self.partition_id = partition_id
        self.cluster_key = cluster_key
        self.segments = segments
        self.segment_bytes = segment_bytes
        self._sealed_bytes = 0  # of every segment but the last: they no longer change
        self._segments_changed()
        # Retention: the first transaction served. The first segment may start below it
        # (only whole segments are deleted); what is below it is never read.
        self.log_start = max(log_start, segments[0].first_txid)

    @classmethod
    def open(
        cls,
        directory: str,
        partition_id: int,
        cluster_key: uuid.UUID,
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        max_torn_bytes: int = DEFAULT_MAX_TORN_BYTES,
        floor: int = NO_TRANSACTION,
    ) -> PartitionLog:
        """Open (creating if new) and recover the partition in ``directory``.

        ``floor`` is the local low-water mark: this replica acknowledged everything up
        to it as committed. Files that hold less, or are corrupt, raise PartitionRefused
        and are left exactly as they are (see ``recovery``).
        """
        if not os.path.isdir(directory):
            os.makedirs(directory)
            fsync_directory(os.path.dirname(os.path.abspath(directory)))
        log_start = read_log_start(directory)
        _delete_leftovers(directory, log_start)  # of a deletion a crash interrupted
        scan = scan_partition(
            directory,
            partition_id,
            cluster_key,
            max_torn_bytes=max_torn_bytes,
            log_start=log_start,
        )
        reason = refusal(scan, floor)
        if reason is not None:
            raise PartitionRefused(reason, recovered_end=scan.end, floor=floor)
        segments: list[Segment] = []
        try:
            for found in scan.segments:
                segments.append(Segment.from_scan(directory, partition_id, cluster_key, found))
            if scan.torn_creation is not None:
                log.warning(
                    "partition %d: %s.seg is shorter than its header (an interrupted "
                    "creation); recreating it",
                    partition_id,
                    segment_stem(scan.torn_creation),
                )
                segments.append(
                    Segment.create(directory, partition_id, cluster_key, scan.torn_creation)
                )
            if not segments:
                segments.append(Segment.create(directory, partition_id, cluster_key, log_start))
            for sealed in segments[:-1]:
                sealed.release_offsets()
        except BaseException:
            for seg in segments:
                seg.close()
            raise
        log_ = cls(directory, partition_id, cluster_key, segments, segment_bytes, log_start)
        if log_.log_start > log_.max_txid + 1:
            # A skip-ahead a crash interrupted (the log-start file written, the new
            # segment not yet): finish it, or appends at the log start never fit.
            log_._start_empty_at_log_start()
        return log_

    @property
    def first_txid(self) -> int:
        """The first transaction ID this node serves (or would store next)."""
        return self.log_start

    @property
    def max_txid(self) -> int:
        """The highest transaction ID stored, durable or not yet synced; -1 when empty."""
        return self.segments[-1].last_txid

    @property
    def size_bytes(self) -> int:
        # Read at the end of every request (the published state): not a sum over what
        # may be thousands of segments on a long-lived node.
        return self._sealed_bytes + self.segments[-1].size

    def _segments_changed(self) -> None:
        """After a segment was added or removed: recount the sealed ones' bytes."""
        self._sealed_bytes = sum(seg.size for seg in self.segments[:-1])

    # --- writes -------------------------------------------------------------------------

    def append(self, batch: RecordBatch) -> None:
        """Write a batch (no fsync). Only the next contiguous transaction IDs are accepted.

        A batch in another record format than ``DEFAULT_FORMAT`` (an older server's) is
        converted: its records' commit times are ``NO_TIMESTAMP``."""
        if not batch.spans:
            return
        expected = self.max_txid + 1
        spans = batch.spans
        n = len(spans)
        # Where the IDs stop following on: the compiled scan, else (and to name it) Python's.
        checked = 0
        if native is not None and type(spans) is list:
            checked = native.first_gap(spans, expected)
        for i in range(checked, n):
            txid = spans[i][0]
            if txid != expected + i:
                raise NonContiguousAppend(
                    f"partition {self.partition_id}: expected transaction {expected + i}, "
                    f"got {txid}" + (f" (record {i} of the batch)" if i else "")
                )
        # After the IDs are checked: the conversion reads every record.
        if batch.format.version != DEFAULT_FORMAT.version:
            batch = batch.convert(DEFAULT_FORMAT)
            spans = batch.spans
        start = 0
        while start < n:
            active = self.segments[-1]
            if active.format.version != DEFAULT_FORMAT.version or (
                active.size >= self.segment_bytes and active.count
            ):
                active = self._roll(spans[start][0])
            # Records that fit before the segment passes its size (at least one).
            room = self.segment_bytes - active.size
            stop = start
            used = 0
            while stop < n and (stop == start or used < room):
                used += spans[stop][2] + _OVERHEAD
                stop += 1
            active.write_batch(batch, start, stop, zeros_until=self.segment_bytes)
            start = stop

    def _roll(self, first_txid: int) -> Segment:
        """A new active segment of ``DEFAULT_FORMAT`` from ``first_txid`` (the next ID):
        the active one is sealed first. An empty active segment (of an older format: a
        full one is never empty) has the new one's name: it is replaced in place."""
        active = self.segments[-1]
        if not active.count:
            # Crash-safe without a rename: Segment.create rewrites the .idx header, fsyncs,
            # then the .seg's, fsyncs. Cut in between, the headers differ (the index is
            # rebuilt: the old empty segment again) or the .seg is shorter than its header
            # (an interrupted creation: recreated empty). Failing (a full disk), create
            # deletes both files: the log then ends where it did (before this segment, or
            # at the log start, from which an open starts an empty one), and ``active``
            # stays in place, its files open, till the next append tries again.
            new = Segment.create(self.directory, self.partition_id, self.cluster_key, first_txid)
            active.close()
            self.segments[-1] = new
            return new
        active.seal()
        active.release_offsets()
        new = Segment.create(self.directory, self.partition_id, self.cluster_key, first_txid)
        self.segments.append(new)
        self._segments_changed()
        return new

    def sync(self, sync_data: Callable[[int], None] | None = None) -> None:
        """fsync everything written since the last sync (only the active segment can be
        dirty); ``sync_data`` makes a data file durable (the node's group sync)."""
        self.segments[-1].sync(sync_data)

    def truncate(self, txid: int) -> None:
        """Drop every transaction after ``txid``, across segments; durable on return."""
        if txid >= self.max_txid:
            return
        if txid < self.first_txid - 1:
            raise TruncateRefused(
                f"partition {self.partition_id}: cannot truncate to {txid}: this node's log "
                f"starts at transaction {self.first_txid}"
            )
        self._cut_after(txid, write_index=True)
        log.info("partition %d truncated after transaction %d", self.partition_id, txid)

    def undo_after(self, txid: int) -> None:
        """Undo appends that were never acknowledged (the disk had no room for them):
        drop the records after ``txid`` and any segment a roll made for them, so the log
        on disk holds again what it did before them; durable on return. Only cuts and
        fsyncs, which need no free space: index entries of the records kept that are
        not yet in the file wait for the next sync, as they did."""
        if txid < self.max_txid:
            self._cut_after(txid, write_index=False)

    def _cut_after(self, txid: int, *, write_index: bool) -> None:
        while len(self.segments) > 1 and self.segments[-1].first_txid > txid + 1:
            seg = self.segments.pop()
            seg.close()
            os.unlink(seg.data_path)
            os.unlink(seg.index_path)
        self._segments_changed()
        self.segments[-1].truncate_after(txid, write_index=write_index)
        fsync_directory(self.directory)

    def advance_log_start(self, log_start: int) -> int:
        """Retention: serve nothing below ``log_start`` and delete the segments wholly
        below it (never the last). Past the end of the log, the replica skips ahead: its
        log becomes empty, starting at ``log_start`` (the server then copies it from
        there). Returns the bytes deleted. Durable on return."""
        if log_start <= self.log_start:
            return 0
        write_log_start(self.directory, log_start)  # first: a crash leaves leftovers only
        self.log_start = log_start
        if log_start > self.max_txid + 1:
            freed = self._start_empty_at_log_start()
        else:
            freed = self._delete_below_log_start()
        log.info(
            "partition %d: log starts at transaction %d (%d bytes deleted)",
            self.partition_id,
            log_start,
            freed,
        )
        return freed

    def _start_empty_at_log_start(self) -> int:
        """Skip ahead: a new empty segment named by the log start, the rest deleted."""
        self.segments[-1].seal()
        self.segments[-1].release_offsets()
        self.segments.append(
            Segment.create(self.directory, self.partition_id, self.cluster_key, self.log_start)
        )
        self._segments_changed()
        return self._delete_below_log_start()

    def _delete_below_log_start(self) -> int:
        freed = 0
        while len(self.segments) > 1 and self.segments[1].first_txid <= self.log_start:
            seg = self.segments.pop(0)
            seg.close()
            freed += seg.size
            os.unlink(seg.index_path)  # the index first: a .seg alone is a leftover by name
            os.unlink(seg.data_path)
        self._segments_changed()
        fsync_directory(self.directory)
        return freed

    def segment_stats(self) -> list[tuple[int, int, int, int, int]]:
        """(first transaction, records, bytes, last modified in ms, the last record's
        commit time) of every segment."""
        stats = []
        for seg in self.segments:
            try:
                modified = int(os.stat(seg.data_path).st_mtime * 1000)
            except OSError:
                modified = 0
            stats.append((seg.first_txid, seg.count, seg.size, modified, seg.last_commit_time()))
        return stats

    def find_time(self, time_ms: int) -> int:
        """The first transaction served (from the log start) committed at or after
        ``time_ms``; ``max_txid + 1`` when there is none. The segments' last commit
        times (kept in memory once read) pick the segment, a binary search over its
        records' heads the transaction: a few reads, however long the log."""
        segments = self.segments
        lo, hi = 0, len(segments)  # the first segment whose last record is late enough
        while lo < hi:
            mid = (lo + hi) // 2
            if segments[mid].count and segments[mid].last_commit_time() >= time_ms:
                hi = mid
            else:
                lo = mid + 1
        if lo == len(segments):
            return self.max_txid + 1
        return max(self.log_start, segments[lo].first_at_or_after(time_ms, self.log_start))

    # --- reads --------------------------------------------------------------------------

    def _segment_of(self, txid: int) -> Segment:
        if not self.log_start <= txid <= self.max_txid:
            raise TransactionNotFound(
                f"partition {self.partition_id}: transaction {txid} is not stored here "
                f"(this node holds {self.first_txid}..{self.max_txid})"
            )
        lo, hi = 0, len(self.segments) - 1
        while lo < hi:  # last segment whose first txid <= txid
            mid = (lo + hi + 1) // 2
            if self.segments[mid].first_txid <= txid:
                lo = mid
            else:
                hi = mid - 1
        return self.segments[lo]

    def read(self, txid: int, max_records: int, max_bytes: int) -> RecordBatch:
        """Up to ``max_records`` records from ``txid``, across segments, checksums verified.

        Stops before ``max_bytes`` of wire records (but returns at least one);
        an empty batch when ``txid`` is past the end of the log.
        """
        if txid > self.max_txid or max_records <= 0:
            return RecordBatch(b"", [], DEFAULT_FORMAT)
        if 0 <= txid < self.log_start:
            raise TransactionNotFound(
                f"partition {self.partition_id}: transaction {txid} is below the log start "
                f"{self.log_start} (deleted by retention)"
            )
        parts: list[RecordBatch] = []
        count = size = 0
        while count < max_records and txid <= self.max_txid and size < max_bytes:
            part = self._segment_of(txid).read_batch(
                txid, max_records - count, max(max_bytes - size, 1)
            )
            if parts and size + len(part.buf) > max_bytes:
                break
            parts.append(part)
            count += len(part)
            size += len(part.buf)
            txid += len(part)
        return parts[0] if len(parts) == 1 else _concat(parts)

    def read_headers(self, txid: int, max_records: int, max_bytes: int) -> list[RecordHeader]:
        return list(self.read(txid, max_records, max_bytes).headers())

    def close(self) -> None:
        for seg in self.segments:
            seg.close()


def _delete_leftovers(directory: str, log_start: int) -> None:
    names = os.listdir(directory)
    firsts = sorted(int(m.group(1)) for n in names if (m := SEGMENT_NAME.match(n)))
    leftovers = leftover_segments(firsts, log_start)
    for first in leftovers:
        log.warning(
            "%s: deleting segment %s, below the log start %d (a deletion was interrupted)",
            directory,
            segment_stem(first),
            log_start,
        )
        for suffix in (".idx", ".seg"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, segment_stem(first) + suffix))
    if leftovers:
        fsync_directory(directory)


def _concat(parts: list[RecordBatch]) -> RecordBatch:
    """One batch of ``parts``, all of one record format (every segment reads in
    ``DEFAULT_FORMAT``)."""
    fmt = parts[0].format
    spans: list[tuple[int, int, int]] = []
    base = 0
    for part in parts:
        if part.format.version != fmt.version:
            raise ValueError(
                f"cannot join batches of record formats {fmt.version} and {part.format.version}"
            )
        spans.extend((txid, pos + base, length) for txid, pos, length in part.spans)
        base += len(part.buf)
    return RecordBatch(b"".join(part.buf for part in parts), spans, fmt)
