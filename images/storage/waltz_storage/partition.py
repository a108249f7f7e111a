"""A partition's log on one storage node: its segments, appends, truncation and reads."""

from __future__ import annotations

import logging
import os
import re
import uuid

from waltz_client.wire.records import RecordBatch, RecordHeader

from .control_file import fsync_directory
from .errors import CorruptSegment, NonContiguousAppend, TransactionNotFound, TruncateRefused
from .segment import Segment, wire_to_disk

log = logging.getLogger(__name__)

_SEGMENT_NAME = re.compile(r"^(\d{19})\.seg$")
DEFAULT_SEGMENT_BYTES = 1024 * 1024 * 1024
# One write group with the default limits (8 MiB group + one 64 MiB frame, x 10/9 on disk).
DEFAULT_MAX_TORN_BYTES = 80 * 1024 * 1024


class PartitionLog:
    """The ordered segments of one partition. Not thread-safe: callers serialise."""

    def __init__(
        self,
        directory: str,
        partition_id: int,
        cluster_key: uuid.UUID,
        segments: list[Segment],
        segment_bytes: int,
    ) -> None:
        self.directory = directory
        self.partition_id = partition_id
        self.cluster_key = cluster_key
        self.segments = segments
        self.segment_bytes = segment_bytes

    @classmethod
    def open(
        cls,
        directory: str,
        partition_id: int,
        cluster_key: uuid.UUID,
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        max_torn_bytes: int = DEFAULT_MAX_TORN_BYTES,
    ) -> PartitionLog:
        """Open (creating if new) and recover the partition in ``directory``."""
        if not os.path.isdir(directory):
            os.makedirs(directory)
            fsync_directory(os.path.dirname(os.path.abspath(directory)))
        firsts = sorted(
            int(m.group(1)) for name in os.listdir(directory) if (m := _SEGMENT_NAME.match(name))
        )
        segments: list[Segment] = []
        try:
            for i, first in enumerate(firsts):
                seg = Segment.open(
                    directory,
                    partition_id,
                    cluster_key,
                    first,
                    is_last=i == len(firsts) - 1,
                    max_torn_bytes=max_torn_bytes,
                )
                if segments and segments[-1].last_txid + 1 != first:
                    raise CorruptSegment(
                        f"partition {partition_id}: {segments[-1]} ends at transaction "
                        f"{segments[-1].last_txid} but the next segment starts at {first}"
                    )
                segments.append(seg)
            if not segments:
                segments.append(Segment.create(directory, partition_id, cluster_key, 0))
        except BaseException:
            for seg in segments:
                seg.close()
            raise
        return cls(directory, partition_id, cluster_key, segments, segment_bytes)

    @property
    def first_txid(self) -> int:
        """The first transaction ID this node stores (or would store next)."""
        return self.segments[0].first_txid

    @property
    def max_txid(self) -> int:
        """The highest transaction ID stored, durable or not yet synced; -1 when empty."""
        return self.segments[-1].last_txid

    @property
    def size_bytes(self) -> int:
        return sum(seg.size for seg in self.segments)

    # --- writes -------------------------------------------------------------------------

    def append(self, batch: RecordBatch) -> None:
        """Write a batch (no fsync). Only the next contiguous transaction IDs are accepted."""
        if not batch.spans:
            return
        expected = self.max_txid + 1
        for i, (txid, _, _) in enumerate(batch.spans):
            if txid != expected + i:
                raise NonContiguousAppend(
                    f"partition {self.partition_id}: expected transaction {expected + i}, "
                    f"got {txid}" + (f" (record {i} of the batch)" if i else "")
                )
        start = 0
        n = len(batch.spans)
        while start < n:
            active = self.segments[-1]
            if active.size >= self.segment_bytes and active.count:
                active.seal()
                active = Segment.create(
                    self.directory, self.partition_id, self.cluster_key, batch.spans[start][0]
                )
                self.segments.append(active)
            # Records that fit before the segment passes its size (at least one).
            room = self.segment_bytes - active.size
            stop = start
            used = 0
            while stop < n and (stop == start or used < room):
                used += batch.spans[stop][2] + 40
                stop += 1
            out = bytearray()
            sizes = wire_to_disk(batch, start, stop, out)
            active.write(out, sizes)
            start = stop

    def sync(self) -> None:
        """fsync everything written since the last sync (only the active segment can be dirty)."""
        self.segments[-1].sync()

    def truncate(self, txid: int) -> None:
        """Drop every transaction after ``txid``, across segments; durable on return."""
        if txid >= self.max_txid:
            return
        if txid < self.first_txid - 1:
            raise TruncateRefused(
                f"partition {self.partition_id}: cannot truncate to {txid}: this node's log "
                f"starts at transaction {self.first_txid}"
            )
        while len(self.segments) > 1 and self.segments[-1].first_txid > txid + 1:
            seg = self.segments.pop()
            seg.close()
            os.unlink(seg.data_path)
            os.unlink(seg.index_path)
        self.segments[-1].truncate_after(txid)
        fsync_directory(self.directory)
        log.info("partition %d truncated after transaction %d", self.partition_id, txid)

    # --- reads --------------------------------------------------------------------------

    def _segment_of(self, txid: int) -> Segment:
        if not self.first_txid <= txid <= self.max_txid:
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
            return RecordBatch(b"", [])
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


def _concat(parts: list[RecordBatch]) -> RecordBatch:
    spans: list[tuple[int, int, int]] = []
    base = 0
    for part in parts:
        spans.extend((txid, pos + base, length) for txid, pos, length in part.spans)
        base += len(part.buf)
    return RecordBatch(b"".join(part.buf for part in parts), spans)
