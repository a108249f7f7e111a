"""A partition's log start on one storage node: the first transaction it still serves.

Retention moves the log start up (never down); segments wholly below it are deleted. The
value is kept in the partition directory, in ``log-start`` (12 bytes: the transaction
ID as a big-endian i64, then the CRC-32 of those 8 bytes), written to a temporary file,
fsync'd and renamed over the old one before any segment is deleted. So after a crash in
the middle of a deletion the file already says which segments are leftovers, and the
next open deletes them instead of taking the gap they leave for damage.

No file means 0: the log starts at transaction 0, as before retention existed.
"""

from __future__ import annotations

import itertools
import os
import struct
import zlib

from waltz_client.runtime.files import fsync_directory

from .errors import CorruptSegment

LOG_START_FILE = "log-start"
_FORMAT = struct.Struct(">qI")


class DamagedLogStart(CorruptSegment):
    """The ``log-start`` file is unreadable: the partition does not open."""


def read_log_start(directory: str) -> int:
    path = os.path.join(directory, LOG_START_FILE)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return 0
    if len(data) != _FORMAT.size:
        raise DamagedLogStart(f"{path}: {len(data)} bytes, expected {_FORMAT.size}")
    value, crc = _FORMAT.unpack(data)
    if zlib.crc32(data[:8]) != crc or value < 0:
        raise DamagedLogStart(
            f"{path}: checksum mismatch (damaged); the cluster metadata holds the "
            f"partition's log start: rebuild this replica, or restore the file"
        )
    return value


def write_log_start(directory: str, log_start: int) -> None:
    """Durably record ``log_start`` (atomic: the old value or the new, never a mix)."""
    path = os.path.join(directory, LOG_START_FILE)
    temporary = path + ".tmp"
    head = struct.pack(">q", log_start)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, head + struct.pack(">I", zlib.crc32(head)))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    fsync_directory(directory)


def leftover_segments(firsts: list[int], log_start: int) -> list[int]:
    """The segments (by first transaction ID, sorted) wholly below ``log_start``: each one
    followed by a segment that starts at or below it. The last segment always stays."""
    return [first for first, following in itertools.pairwise(firsts) if following <= log_start]
