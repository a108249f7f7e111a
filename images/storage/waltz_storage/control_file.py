"""The control file ``waltz-storage.ctl``: cluster identity and per-partition session state.

Layout (big-endian; docs/on-disk.md has the table)::

    header, 128 bytes:  i32 format version | i64 creation time (ms) | 16-byte cluster key
                        | i32 number of partitions | u32 CRC-32 of the previous 32 bytes
                        | 92 reserved zero bytes
    per partition p, at 128 + 100 * p:
                        i32 partition id | PartitionInfo slot 0 | PartitionInfo slot 1
    PartitionInfo, 48 bytes:
                        u64 sequence | i64 fence session id | i64 session id
                        | i64 low-water mark | i64 local low-water mark | u32 flags
                        | u32 CRC-32 of the previous 44 bytes

An update writes the slot that does not hold the newest valid struct, with
the sequence number one higher, and fsyncs. A torn write can damage only
that slot; the reader then falls back to the other (the previous state).

The partition count only grows (``grow``): the whole file is written anew next to it
and renamed over it, so a crash leaves either the old file or the new one.
"""

from __future__ import annotations

import contextlib
import os
import struct
import threading
import time
import uuid
import zlib
from dataclasses import dataclass, replace

from waltz_client.runtime.files import fsync_directory

from .errors import ControlFileError

CONTROL_FILE_NAME = "waltz-storage.ctl"
FORMAT_VERSION = 1

HEADER_BYTES = 128
_HEADER = struct.Struct(">iq16si")
_CRC = struct.Struct(">I")
_INFO = struct.Struct(">QqqqqI")
INFO_BYTES = _INFO.size + _CRC.size  # 48
_PARTITION_ID = struct.Struct(">i")
ENTRY_BYTES = _PARTITION_ID.size + 2 * INFO_BYTES  # 100

NO_SESSION = -1
NO_TRANSACTION = -1


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """Durable session state of one partition on this node.

    ``fence_session_id`` is the highest session ID ever seen: requests of
    older sessions are refused. ``session_id`` is the session that last set
    the low-water marks (what Last Session Info reports).
    """

    sequence: int = 0
    fence_session_id: int = NO_SESSION
    session_id: int = NO_SESSION
    low_water_mark: int = NO_TRANSACTION
    local_low_water_mark: int = NO_TRANSACTION
    flags: int = 0

    def encode(self) -> bytes:
        body = _INFO.pack(
            self.sequence,
            self.fence_session_id,
            self.session_id,
            self.low_water_mark,
            self.local_low_water_mark,
            self.flags,
        )
        return body + _CRC.pack(zlib.crc32(body))

    @classmethod
    def decode(cls, data: bytes) -> PartitionInfo | None:
        """The struct, or None when its checksum does not match (a torn or corrupt slot)."""
        body = data[: _INFO.size]
        (crc,) = _CRC.unpack_from(data, _INFO.size)
        if zlib.crc32(body) != crc:
            return None
        return cls(*_INFO.unpack(body))


def entry_offset(partition_id: int) -> int:
    return HEADER_BYTES + ENTRY_BYTES * partition_id


def slot_offset(partition_id: int, slot: int) -> int:
    return entry_offset(partition_id) + _PARTITION_ID.size + INFO_BYTES * slot


def fresh_entries(first: int, end: int) -> bytes:
    """The entries of partitions ``first..end-1`` as ``create`` writes them: slot 0 with
    sequence 0, slot 1 with sequence 1, both valid and empty (slot 1 is the newest)."""
    initial = PartitionInfo()
    slot0, slot1 = initial.encode(), replace(initial, sequence=1).encode()
    return b"".join(_PARTITION_ID.pack(p) + slot0 + slot1 for p in range(first, end))


def check_growth(current: int, new_count: int) -> bool:
    """Whether going from ``current`` partitions to ``new_count`` grows the file (False:
    already there). Fewer raises: a partition, once it exists, keeps its session state."""
    if new_count < current:
        raise ControlFileError(
            f"partitions never shrink: the control file has {current}, asked for {new_count}"
        )
    return new_count > current


class ControlFile:
    """An open control file. Partition updates from different threads are safe: every use
    of the file descriptor holds a lock, which ``grow`` holds while it replaces the file
    (an update made to the old file during the copy would be lost)."""

    def __init__(
        self,
        path: str,
        fd: int,
        version: int,
        created_ms: int,
        cluster_key: uuid.UUID,
        num_partitions: int,
    ) -> None:
        self.path = path
        self._fd = fd
        self._lock = threading.Lock()
        self.version = version
        self.created_ms = created_ms
        self.cluster_key = cluster_key
        self.num_partitions = num_partitions

    @staticmethod
    def encode_header(cluster_key: uuid.UUID, num_partitions: int, created_ms: int) -> bytes:
        head = _HEADER.pack(FORMAT_VERSION, created_ms, cluster_key.bytes, num_partitions)
        head += _CRC.pack(zlib.crc32(head))
        return head.ljust(HEADER_BYTES, b"\x00")

    @classmethod
    def create(cls, directory: str, cluster_key: uuid.UUID, num_partitions: int) -> ControlFile:
        """Write a new control file atomically (temp file, fsync, rename, fsync directory)."""
        if num_partitions < 1:
            raise ControlFileError(f"number of partitions must be at least 1, got {num_partitions}")
        path = os.path.join(directory, CONTROL_FILE_NAME)
        created_ms = int(time.time() * 1000)
        image = cls.encode_header(cluster_key, num_partitions, created_ms)
        image += fresh_entries(0, num_partitions)
        os.close(_write_beside(path, image))
        fsync_directory(directory)
        return cls.open(directory)

    @classmethod
    def open(cls, directory: str) -> ControlFile:
        path = os.path.join(directory, CONTROL_FILE_NAME)
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            raise ControlFileError(f"{path}: no control file") from None
        try:
            head = os.pread(fd, HEADER_BYTES, 0)
            if len(head) < HEADER_BYTES:
                raise ControlFileError(f"{path}: header is {len(head)} bytes, expected 128")
            version, created_ms, key, num_partitions = _HEADER.unpack_from(head)
            (crc,) = _CRC.unpack_from(head, _HEADER.size)
            if zlib.crc32(head[: _HEADER.size]) != crc:
                raise ControlFileError(f"{path}: header checksum mismatch (corrupt control file)")
            if version != FORMAT_VERSION:
                raise ControlFileError(
                    f"{path}: format version {version} is not supported (this build reads "
                    f"{FORMAT_VERSION})"
                )
            if num_partitions < 1:
                raise ControlFileError(f"{path}: invalid number of partitions {num_partitions}")
            size = os.fstat(fd).st_size
            expected = entry_offset(num_partitions)
            if size < expected:
                raise ControlFileError(
                    f"{path}: {size} bytes, expected {expected} for {num_partitions} partitions"
                )
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, version, created_ms, uuid.UUID(bytes=key), num_partitions)

    def grow(self, new_count: int) -> bool:
        """Grow the file to ``new_count`` partitions, the new ones in the state ``create``
        writes; True if it grew (False: it has ``new_count`` already). Fewer raises
        ControlFileError.

        Crash-safe: the complete new file is written and fsync'd under a temporary name,
        renamed over this one and the directory fsync'd, so the file on disk is always
        the old one or the new one (a torn header written in place would make it
        unopenable). The old partitions' entries are copied byte for byte."""
        with self._lock:
            if not check_growth(self.num_partitions, new_count):
                return False
            old_end = entry_offset(self.num_partitions)
            entries = os.pread(self._fd, old_end - HEADER_BYTES, HEADER_BYTES)
            if len(entries) != old_end - HEADER_BYTES:
                raise ControlFileError(
                    f"{self.path}: shorter than its {self.num_partitions} entries"
                )
            image = (
                self.encode_header(self.cluster_key, new_count, self.created_ms)
                + entries
                + fresh_entries(self.num_partitions, new_count)
            )
            fd = _write_beside(self.path, image)
            # From the rename on, the path names the new file: its descriptor (opened
            # before the rename, so no reopen can fail) replaces the old one at once, or
            # updates would go to the replaced file.
            os.close(self._fd)
            self._fd = fd
            self.num_partitions = new_count
            # Still under the lock: no update lands in the new file before its name is
            # durable (a crash before this fsync may bring back the old file).
            fsync_directory(os.path.dirname(self.path) or ".")
            return True

    def _check_partition(self, partition_id: int) -> None:
        if not 0 <= partition_id < self.num_partitions:
            raise ControlFileError(
                f"partition {partition_id} is outside 0..{self.num_partitions - 1}"
            )

    def read_slots(self, partition_id: int) -> tuple[PartitionInfo | None, PartitionInfo | None]:
        """Both slots of a partition; a slot with a bad checksum reads as None."""
        with self._lock:
            return self._read_slots(partition_id)

    def _read_slots(self, partition_id: int) -> tuple[PartitionInfo | None, PartitionInfo | None]:
        self._check_partition(partition_id)
        entry = os.pread(self._fd, ENTRY_BYTES, entry_offset(partition_id))
        (stored_id,) = _PARTITION_ID.unpack_from(entry)
        if stored_id != partition_id:
            raise ControlFileError(
                f"{self.path}: entry {partition_id} is labelled partition {stored_id} (corrupt)"
            )
        start = _PARTITION_ID.size
        return (
            PartitionInfo.decode(entry[start : start + INFO_BYTES]),
            PartitionInfo.decode(entry[start + INFO_BYTES : start + 2 * INFO_BYTES]),
        )

    def read_partition(self, partition_id: int) -> PartitionInfo:
        """The newest valid struct. Both damaged is an error naming the partition."""
        a, b = self.read_slots(partition_id)
        if a is None and b is None:
            raise ControlFileError(
                f"{self.path}: both partition-info structs of partition {partition_id} fail "
                f"their checksums; refusing to open partition {partition_id}"
            )
        if a is None:
            return b  # type: ignore[return-value]
        if b is None:
            return a
        return a if a.sequence > b.sequence else b

    def write_partition(
        self, partition_id: int, info: PartitionInfo, *, sync: bool = True
    ) -> PartitionInfo:
        """Persist ``info`` into the slot not holding the newest struct; fsync (unless
        ``sync`` is false: the caller then calls ``sync`` before anything depends on it);
        return it."""
        with self._lock:
            a, b = self._read_slots(partition_id)
            if a is None and b is None:
                newest_slot, sequence = 1, 0
            elif b is None or (a is not None and a.sequence > b.sequence):
                newest_slot, sequence = 0, a.sequence  # type: ignore[union-attr]
            else:
                newest_slot, sequence = 1, b.sequence
            stored = replace(info, sequence=sequence + 1)
            os.pwrite(self._fd, stored.encode(), slot_offset(partition_id, 1 - newest_slot))
            if sync:
                os.fsync(self._fd)
            return stored

    def sync(self) -> None:
        """fsync what ``write_partition(..., sync=False)`` wrote: one fsync for the
        session states of many partitions (a group of requests, ``process_group``)."""
        with self._lock:
            os.fsync(self._fd)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def _write_beside(path: str, image: bytes) -> int:
    """Write ``image`` to ``path.tmp``, fsync it and rename it over ``path``; a read-write
    descriptor of the new file. The caller fsyncs the directory (the rename is durable only
    then). A crash leaves ``path`` as it was or as ``image``, and at worst a stale
    ``path.tmp``, which the next call truncates; a failure removes the temporary file."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(image)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
        os.replace(tmp, path)
    except OSError:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return fd
