"""A sealed segment's record offsets, read from its ``.idx`` file instead of memory.

A segment knows where each of its records starts: 8 bytes a record. Kept in memory for
every segment, that grows with everything a node stores (8 GiB for a TiB of 1 KiB
records). Once a segment is sealed its index file holds exactly those offsets, written
from the checked records and fsync'd, and they never change again, so the segment reads
the few it needs for a read from the file (``pread``): the kernel's page cache holds
them, and may drop them, like the records themselves. (Not a memory map: a file cut
short under a mapping kills the process on access, where a short read is an error.)

An entry the disk damaged later is caught where any wrong index entry is: a read checks
every record it returns against its ends (``disk_to_wire``), the segment refuses offsets
out of order (``Segment._span``), and a short index file is ``CorruptSegment`` here.
"""

from __future__ import annotations

import os
import struct
import sys
from array import array
from collections.abc import Iterator, Sequence
from typing import overload

from .errors import CorruptSegment

_ENTRY = struct.Struct(">q")  # an index entry: a big-endian i64 offset


class IndexedOffsets(Sequence[int]):
    """The first ``count`` entries of an open index file, after its ``header_bytes``:
    indexing gives an offset, slicing an ``array('q')`` of them. The file descriptor
    stays the segment's; after it is closed only the length is left to ask."""

    def __init__(self, index_fd: int, count: int, header_bytes: int, path: str) -> None:
        length = header_bytes + 8 * count
        size = os.fstat(index_fd).st_size
        if size < length:
            raise ValueError(f"the index holds {size} bytes, not the {length} of {count} entries")
        self._fd = index_fd
        self._count = count
        self._header = header_bytes
        self._path = path

    def __len__(self) -> int:
        return self._count

    def _read(self, first: int, n: int) -> bytes:
        at = self._header + 8 * first
        data = os.pread(self._fd, 8 * n, at)
        if len(data) != 8 * n:
            raise CorruptSegment(
                f"{self._path}: {len(data)} bytes at offset {at} where {self._count} entries "
                f"need {8 * n} (the index was cut short)"
            )
        return data

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> array: ...
    def __getitem__(self, i: int | slice) -> int | array:
        if isinstance(i, slice):
            start, stop, step = i.indices(self._count)
            if step != 1:
                return array("q", [self[k] for k in range(start, stop, step)])
            entries = array("q")
            if stop > start:
                entries.frombytes(self._read(start, stop - start))
                if sys.byteorder == "little":
                    entries.byteswap()
            return entries
        if i < 0:
            i += self._count
        if not 0 <= i < self._count:
            raise IndexError("index entry out of range")
        return _ENTRY.unpack(self._read(i, 1))[0]

    def __iter__(self) -> Iterator[int]:
        return iter(self[:])  # one read, not one a record

    def to_array(self) -> array:
        """Every offset, in memory (a segment that becomes the active one again)."""
        return self[:]

    def forget_file(self) -> None:
        """The segment closed its index file: never read a descriptor that may since
        belong to another file (the length stays: a closed segment still counts)."""
        self._fd = -1
