"""Storage engine errors. Each message says what is wrong and where."""


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
