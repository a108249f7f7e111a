"""Appending DataFrame rows to the log (``df.write.format("waltz")``).

Each row is one transaction: ``partition``, ``header``, ``data`` and optional
``write_locks``, ``read_locks``, ``append_locks`` (arrays of longs, the IDs of locks
named by the ``lockName`` option). A task appends its rows through the client, with
its retries, many in flight at once.

Delivery: Spark may run a task again (a lost executor, speculation), and a rerun
appends its rows again. Locks make a write idempotent: with
``lockHighWaterMark=job`` (the batch default) every row's locks are checked against
the log as it was when the write began, so a row whose lock another row (or an
earlier run of the same task) has taken since then fails instead of appending twice.
A whole job run again passes the marks of its first run as JSON
(``lockHighWaterMark={"0": 120, ...}``): its rows then fail in the same way.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

from pyspark.sql import Row
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, LongType, StructType

from waltz_client.client import SubmitStatus, WaltzClient, WaltzError
from waltz_client.transaction import Lock, TransactionBuilder, TransactionContext

from .options import WaltzOptionError, WriteOptions
from .split_reader import open_client

log = logging.getLogger(__name__)

LOCK_COLUMNS = ("write_locks", "read_locks", "append_locks")
CHUNK_ROWS = 2000  # rows handed to the client's event loop at a time


def check_schema(schema: StructType) -> None:
    """The columns the sink needs, with types it can append; others are refused."""
    fields = {f.name: f.dataType for f in schema.fields}
    wanted = {
        "partition": ((IntegerType, LongType), "int"),
        "header": ((IntegerType, LongType), "int"),
        "data": ((BinaryType,), "binary"),
    }
    for name, (kinds, expected) in wanted.items():
        if name not in fields:
            raise WaltzOptionError(
                f"column {name!r} is missing: the waltz sink appends rows of partition int, "
                f"header int, data binary (and optional write_locks, read_locks, append_locks)"
            )
        if not isinstance(fields[name], kinds):
            raise WaltzOptionError(
                f"column {name!r} is {fields[name].simpleString()}, expected {expected}"
            )
    for name in LOCK_COLUMNS:
        kind = fields.get(name)
        if kind is not None and not (
            isinstance(kind, ArrayType) and isinstance(kind.elementType, LongType | IntegerType)
        ):
            raise WaltzOptionError(
                f"column {name!r} is {kind.simpleString()}, expected array<bigint>"
            )
    extra = sorted(set(fields) - set(wanted) - set(LOCK_COLUMNS))
    if extra:
        raise WaltzOptionError(f"columns {extra} are not understood by the waltz sink")


def job_high_water_marks(options: WriteOptions) -> dict[int, int] | None:
    """The marks every row's locks are checked against: each partition's high-water mark
    as the write begins (lockHighWaterMark=job), the ones given, or None for the
    client's current view."""
    if options.lock_high_water_mark == "given":
        return options.lock_marks
    if options.lock_high_water_mark != "job":
        return None
    with open_client(options) as client:
        return {p: client.high_water_mark(p) for p in range(client.num_partitions)}


@dataclass
class WaltzCommitMessage(WriterCommitMessage):
    rows: int = 0
    # partition -> (first, last) transaction ID this task appended
    ranges: dict[int, tuple[int, int]] = field(default_factory=dict)


class _RowAppend(TransactionContext):
    def __init__(
        self,
        index: int,
        row: Row,
        lock_name: str,
        fixed_high_water_marks: dict[int, int] | None,
        max_retries: int,
    ) -> None:
        self.index = index
        self.partition = int(row["partition"])
        self.header = int(row["header"])
        self.data = bytes(row["data"]) if row["data"] is not None else b""
        self.locks = {
            name: [Lock(lock_name, int(i)) for i in (_get(row, name) or ())]
            for name in LOCK_COLUMNS
        }
        self.fixed = fixed_high_water_marks
        self.max_retries = max_retries
        self.conflict: int | None = None

    def partition_id(self, num_partitions: int) -> int:
        return self.partition

    def execute(self, builder: TransactionBuilder) -> bool:
        if self.conflict is not None and self.fixed is not None:
            return False  # checked against the job's start: a conflict is final
        builder.set_header(self.header)
        builder.set_data(self.data)
        builder.set_write_locks(*self.locks["write_locks"])
        builder.set_read_locks(*self.locks["read_locks"])
        builder.set_append_locks(*self.locks["append_locks"])
        if self.fixed is not None:
            builder.client_high_water_mark = self.fixed.get(self.partition, -1)
            # (a partition the marks leave out: checked against the whole log)
        return True

    def on_lock_failure(self, transaction_id: int) -> None:
        self.conflict = transaction_id

    def describe(self) -> str:
        locks = ", ".join(
            f"{name} {[lock.id for lock in locks]}" for name, locks in self.locks.items() if locks
        )
        return (
            f"row {self.index} of the task (partition {self.partition}, header {self.header}, "
            f"{len(self.data)} bytes{', ' + locks if locks else ''})"
        )


def _get(row: Row, name: str):
    try:
        return row[name]
    except (KeyError, ValueError):
        return None


async def _append_chunk(
    client: WaltzClient, rows: list[_RowAppend], message: WaltzCommitMessage
) -> None:
    results = await asyncio.gather(*(client.submit(r) for r in rows))
    for row, result in zip(rows, results, strict=True):
        if result.status != SubmitStatus.COMMITTED:
            if row.conflict is not None:
                why = f"a lock was taken by transaction {row.conflict}"
            else:
                why = result.reason or result.status.name.lower()
            raise WaltzError(f"waltz sink: {row.describe()} was not appended: {why}")
        assert result.transaction_id is not None
        first, last = message.ranges.get(row.partition, (result.transaction_id,) * 2)
        message.ranges[row.partition] = (
            min(first, result.transaction_id),
            max(last, result.transaction_id),
        )
        message.rows += 1


def append_rows(
    options: WriteOptions, rows: Iterator[Row], fixed: dict[int, int] | None
) -> WaltzCommitMessage:
    message = WaltzCommitMessage()
    with open_client(options) as client:
        n = client.num_partitions
        chunk: list[_RowAppend] = []
        for index, row in enumerate(rows):
            append = _RowAppend(index, row, options.lock_name, fixed, options.max_retries)
            if not 0 <= append.partition < n:
                raise WaltzError(
                    f"waltz sink: {append.describe()}: partition {append.partition} does not "
                    f"exist (the cluster has {n}: 0..{n - 1})"
                )
            chunk.append(append)
            if len(chunk) >= min(CHUNK_ROWS, options.max_in_flight):
                client._call(_append_chunk(client.client, chunk, message))
                chunk = []
        if chunk:
            client._call(_append_chunk(client.client, chunk, message))
    return message


class WaltzWriter(DataSourceWriter):
    def __init__(
        self, options: WriteOptions, schema: StructType, fixed: dict[int, int] | None
    ) -> None:
        check_schema(schema)
        self.options = options
        self.fixed = fixed

    def write(self, iterator: Iterator[Row]) -> WriterCommitMessage:
        return append_rows(self.options, iterator, self.fixed)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        rows = sum(m.rows for m in messages if isinstance(m, WaltzCommitMessage))
        log.info("waltz sink: %d rows appended", rows)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        rows = sum(m.rows for m in messages if isinstance(m, WaltzCommitMessage))
        log.warning(
            "waltz sink: the write failed; %d rows of the tasks that finished were appended "
            "and stay in the log (a log is never rolled back)",
            rows,
        )


class WaltzStreamWriter(DataSourceStreamWriter):
    """Each micro-batch appends its rows; locks are checked against the client's own
    view of the log (lockHighWaterMark=current)."""

    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        check_schema(schema)
        self.options = options

    def write(self, iterator: Iterator[Row]) -> WriterCommitMessage:
        return append_rows(self.options, iterator, None)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        rows = sum(m.rows for m in messages if isinstance(m, WaltzCommitMessage))
        log.info("waltz sink: micro-batch %d: %d rows appended", batchId, rows)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("waltz sink: micro-batch %d failed; rows already appended stay", batchId)
