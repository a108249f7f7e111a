"""New storage nodes' directories written from restored records (``waltz restore``).

Everything a restore must know of the storage layout is here: the control file of the
new cluster key; for every partition a node holds, its folder, the ``log-start`` file
when the log starts above transaction 0, the records appended and sealed, and the
partition's control struct as a store session's recovery leaves it (that session, the
low-water mark and the local low-water mark at the last transaction). The caller
(``waltz_client.tools.backup.restore``) reads and checks the backup and places the
replicas; this writes what it is given, in segments of this build's format (format 2:
records of a backup made before commit times are written with none, ``NO_TIMESTAMP``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from waltz_client.runtime.files import fsync_directory
from waltz_client.wire.records import RecordBatch

from .control_file import ControlFile, PartitionInfo
from .errors import StorageEngineError
from .log_start import write_log_start
from .partition import DEFAULT_SEGMENT_BYTES, PartitionLog


class RestoredLogMismatch(StorageEngineError):
    """A restored log does not hold the transactions it was given (first..last)."""


@dataclass(frozen=True, slots=True)
class RestoredPartition:
    """One partition to restore, on every node that holds it."""

    partition_id: int
    first: int  # the first transaction restored: the partition's log start
    high_water_mark: int  # the last: the low-water marks the control structs record
    holders: Sequence[str]  # the storage directories of the nodes holding it
    # Its records first..high_water_mark, read once for all; of either record format (the
    # log converts format 1's).
    batches: Iterable[RecordBatch]


def write_restored_nodes(
    directories: Sequence[str],
    cluster_key: uuid.UUID,
    num_partitions: int,
    partitions: Iterable[RestoredPartition],
    *,
    session: int,
    segment_bytes: int | None = None,
    on_written: Callable[[RestoredPartition], None] = lambda partition: None,
) -> dict[str, list[int]]:
    """Write the new nodes' ``directories`` (each existing and empty): a control file of
    ``cluster_key`` in each, then each of ``partitions`` on its holders, as ``session``'s
    recovery leaves it; ``on_written`` after each. Returns the partitions written to each
    directory. RestoredLogMismatch when a log does not hold first..high_water_mark."""
    controls: dict[str, ControlFile] = {}
    written: dict[str, list[int]] = {directory: [] for directory in directories}
    try:
        for directory in directories:
            controls[directory] = ControlFile.create(directory, cluster_key, num_partitions)
        for partition in partitions:
            _write_logs(partition, cluster_key, segment_bytes or DEFAULT_SEGMENT_BYTES)
            restored = PartitionInfo(
                fence_session_id=session,
                session_id=session,
                low_water_mark=partition.high_water_mark,
                local_low_water_mark=partition.high_water_mark,
            )
            for directory in partition.holders:
                controls[directory].write_partition(partition.partition_id, restored)
                written[directory].append(partition.partition_id)
            on_written(partition)
    finally:
        for control in controls.values():
            control.close()
    return written


def _write_logs(partition: RestoredPartition, cluster_key: uuid.UUID, segment_bytes: int) -> None:
    """The partition's folder, log start and records on each of its holders, sealed."""
    p = partition.partition_id
    logs: list[PartitionLog] = []
    try:
        for directory in partition.holders:
            folder = os.path.join(directory, str(p))
            os.makedirs(folder)
            fsync_directory(directory)
            if partition.first > 0:
                write_log_start(folder, partition.first)
            logs.append(PartitionLog.open(folder, p, cluster_key, segment_bytes=segment_bytes))
        # Each batch is read (and checked again) once for all the replicas.
        for batch in partition.batches:
            for plog in logs:
                plog.append(batch)
        for plog in logs:
            for segment in plog.segments:
                segment.seal()
            if plog.max_txid != partition.high_water_mark or plog.first_txid != partition.first:
                raise RestoredLogMismatch(
                    f"partition {p}: the restored log holds {plog.first_txid}.."
                    f"{plog.max_txid}, expected {partition.first}..{partition.high_water_mark}"
                )
    finally:
        for plog in logs:
            plog.close()
