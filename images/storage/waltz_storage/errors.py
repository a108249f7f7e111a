"""Storage engine errors. Each message says what is wrong and where."""


class StorageEngineError(Exception):
    """Base class for errors of the on-disk engine."""


class ControlFileError(StorageEngineError):
    """The control file is missing, corrupt, or belongs to another cluster."""


class CorruptSegment(StorageEngineError):
    """A segment holds damaged records that cannot be a torn tail; the partition refuses to open."""


class NonContiguousAppend(StorageEngineError):
    """An append whose first transaction ID is not the partition's next one."""


class TransactionNotFound(StorageEngineError):
    """A read of a transaction ID this partition does not hold."""


class TruncateRefused(StorageEngineError):
    """A truncate that would drop data the partition must keep."""


class PartitionUnavailable(StorageEngineError):
    """The partition failed to open or failed an fsync; it serves nothing until restart."""
