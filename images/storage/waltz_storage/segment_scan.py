"""What a check of one segment's files found: recovery (``recovery.py``) makes it and
decides on it, ``Segment.from_scan`` opens the segment from it. Read-only values."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, replace

from waltz_client.wire.records import RecordFormat

from .segment_format import record_format_of, segment_stem


@dataclass(frozen=True, slots=True)
class Damage:
    """Where the valid records of a segment stop before the end of its file."""

    offset: int
    txid: int  # the transaction the record there should hold
    cut: int  # bytes from the damage to the end of the file
    where: str  # "partition P segment S: <problem> at offset O (transaction T)"
    reason: str | None  # why this cannot be a torn tail; None: a torn tail, which may be cut


@dataclass(frozen=True, slots=True)
class SegmentScan:
    """One segment as found on disk (read-only)."""

    first_txid: int
    header: bytes
    created_ms: int
    size: int  # where the file's non-zero bytes end: its records' end unless damaged
    offsets: array  # of every valid record, up to the damage if any
    hints: array  # the .idx entries: each was written after its record's fsync
    index_note: str | None  # why the .idx gives no entries at all (missing, other header)
    damage: Damage | None
    version: int  # the header's format version: the records' format (``record_format_of``)
    # A segment before the last whose index holds exactly its checked records' offsets:
    # how many; ``offsets`` and ``hints`` are then dropped (``in_index``), so a partition's
    # scan holds one segment's offsets at a time, not the whole log's.
    indexed_records: int = -1

    @property
    def name(self) -> str:
        return segment_stem(self.first_txid) + ".seg"

    @property
    def format(self) -> RecordFormat:
        return record_format_of(self.version)

    @property
    def in_index(self) -> bool:
        return self.indexed_records >= 0

    @property
    def count(self) -> int:
        return self.indexed_records if self.in_index else len(self.offsets)

    @property
    def last_txid(self) -> int:
        return self.first_txid + self.count - 1

    def offsets_left_in_index(self) -> SegmentScan:
        """This scan without its offsets, when its index holds exactly them (a segment
        before the last, undamaged); else itself."""
        if self.damage is not None or self.index_note is not None or self.hints != self.offsets:
            return self
        empty = array("q")
        return replace(self, offsets=empty, hints=empty, indexed_records=len(self.offsets))
