"""Storage engine errors. Each message says what is wrong and where."""

from __future__ import annotations

import errno

# A write that fails for want of room (a full disk, a quota, a file-size limit).
OUT_OF_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


class StorageEngineError(Exception):
    """Base class for errors of the on-disk engine."""


class ControlFileError(StorageEngineError):
    """The control file is missing, corrupt, or belongs to another cluster."""


class CorruptSegment(StorageEngineError):
    """A segment holds damaged records that cannot be a torn tail; the partition refuses to open."""


class PartitionRefused(CorruptSegment):
    """The partition's files hold less than it acknowledged, or are corrupt: it stays
    unavailable, its files untouched, until the replica is rebuilt."""

    def __init__(self, message: str, *, recovered_end: int, floor: int) -> None:
        super().__init__(message)
        self.recovered_end = recovered_end  # last transaction of the intact log (-1: none)
        self.floor = floor  # the local low-water mark it was checked against


class NonContiguousAppend(StorageEngineError):
    """An append whose first transaction ID is not the partition's next one."""


class TransactionNotFound(StorageEngineError):
    """A read of a transaction ID this partition does not hold."""


class TruncateRefused(StorageEngineError):
    """A truncate that would drop data the partition must keep."""


class PartitionUnavailable(StorageEngineError):
    """The partition failed to open or failed an fsync; it serves nothing until restart."""


class OutOfSpace(OSError):
    """A write of an append (its records, an index entry, a new segment's header) found
    no room, before anything it wrote was acknowledged. Unlike a failed fsync, nothing
    is in doubt: the caller undoes the append, answers it, and the next append that
    fits goes on, with no restart. An fsync is never retried, so only writes raise this."""

    def __init__(self, error: OSError, what: str) -> None:
        super().__init__(error.errno, f"{error.strerror or error} ({what})")


def out_of_space(error: OSError, what: str) -> OSError:
    """``error`` as an ``OutOfSpace`` when it says the disk had no room, else as it is."""
    if isinstance(error, OutOfSpace) or error.errno not in OUT_OF_SPACE_ERRNOS:
        return error
    return OutOfSpace(error, what)
