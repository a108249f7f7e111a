"""The ``waltz`` PySpark data source: batch and streaming reads of the log, and writes.

    spark.dataSource.register(WaltzDataSource)
    spark.read.format("waltz").option("zookeeper", "zk:2181").load()

Planning (the offsets, the splits) runs on the driver with a client that mounts
nothing; each split is read on an executor through the client's range reads.
"earliest" is each partition's log start (retention moves it up), from its metadata in
ZooKeeper; a range that starts below it fails at planning or, with
``failOnDataLoss=false``, starts at it (a task that finds the log start moved since
does the same: split_reader).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from waltz_client.blocking import BlockingWaltzClient
from waltz_client.errors import WaltzError

from .arrow import SCHEMA_DDL
from .log_starts import LogStarts
from .options import (
    ByTime,
    Position,
    ReadOptions,
    WaltzOptionError,
    parse_read_options,
    parse_write_options,
)
from .planning import (
    Split,
    check_range,
    chosen_partitions,
    decode_offsets,
    encode_offsets,
    limit_offsets,
    option_name,
    plan_splits,
    resolve,
    resolve_by_time,
)
from .split_reader import open_client, read_split, skip_lost
from .writer import WaltzStreamWriter, WaltzWriter, job_high_water_marks
from .zookeeper import describe

log = logging.getLogger(__name__)


class WaltzInputPartition(InputPartition):
    def __init__(self, split: Split) -> None:
        super().__init__(split)
        self.split = split


class WaltzDataSource(DataSource):
    """Short name ``waltz``. Options: docs/spark.md."""

    @classmethod
    def name(cls) -> str:
        return "waltz"

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return WaltzBatchReader(parse_read_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        # Spark creates the stream reader when the query starts (``load()`` cannot tell a
        # stream from a batch: both only ask for the schema). PySpark 4's streaming
        # runner loses an exception raised here behind its own UnboundLocalError (it
        # stops a reader it never got), so a bad option is raised by the reader's first
        # call instead, which fails the query with this message before any batch.
        try:
            options = parse_read_options(self.options, streaming=True)
        except WaltzOptionError as e:
            return _RefusedStreamReader(e)
        return WaltzStreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        options = parse_write_options(self.options, streaming=False)
        return WaltzWriter(options, schema, job_high_water_marks(options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return WaltzStreamWriter(parse_write_options(self.options, streaming=True), schema)


def _driver_client(options: ReadOptions, log_starts: LogStarts) -> BlockingWaltzClient:
    """The driver's client, once ``log_starts`` has reached ZooKeeper (within
    requestTimeout: the client itself would wait for it longer)."""
    log_starts.connect()
    return open_client(options)


def _latest(client: BlockingWaltzClient, partitions: list[int]) -> dict[int, int]:
    """The next transaction ID of each partition (its high-water mark + 1)."""
    return {p: client.high_water_mark(p) + 1 for p in partitions}


def _positions(
    options: ReadOptions,
    client: BlockingWaltzClient,
    position: Position,
    partitions: list[int],
    earliest: dict[int, int],
    latest: dict[int, int],
    *,
    ending: bool,
) -> dict[int, int]:
    """Where the read starts (or ends) in each partition: offsets, or by commit time
    through the servers' time index (``find_time``, one request a partition, after
    ``latest`` was read: a transaction committed since is beyond this read)."""
    if isinstance(position, ByTime):
        option = position.option

        def find_time(partition: int, timestamp_ms: int) -> int:
            try:
                return client.find_time(partition, timestamp_ms)
            except WaltzError as e:  # e.g. a server too old to have a time index
                raise WaltzError(f"{option}: partition {partition}: {e}") from e

        return resolve_by_time(
            position,
            partitions,
            latest,
            find_time,
            ending=ending,
            strategy=options.by_timestamp_strategy,
        )
    return resolve(position, option_name(position, ending), partitions, earliest, latest)


def _skip_lost(
    options: ReadOptions,
    start: dict[int, int],
    log_starts: dict[int, int],
    end: dict[int, int],
) -> dict[int, int]:
    """``start`` with each partition that starts below its log start failed or moved up
    to it (``skip_lost``)."""
    return {p: skip_lost(options, p, start[p], log_starts[p], end[p]) for p in sorted(start)}


def _input_partitions(
    start: dict[int, int], end: dict[int, int], max_per_split: int
) -> list[InputPartition]:
    splits = plan_splits(start, end, max_per_split)
    if not splits:  # nothing to read: one empty split, so the plan still has a task
        first = min(start, default=0)
        splits = [Split(first, start.get(first, 0), start.get(first, 0))]
    return [WaltzInputPartition(s) for s in splits]


class WaltzBatchReader(DataSourceReader):
    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def __repr__(self) -> str:
        return describe(self.options)

    def partitions(self) -> Sequence[InputPartition]:
        o = self.options
        with LogStarts(o) as log_starts, _driver_client(o, log_starts) as client:
            partitions = chosen_partitions(o.partitions, client.num_partitions)
            earliest = log_starts.read(partitions)  # first: never beyond latest
            latest = _latest(client, partitions)
            start = _positions(o, client, o.starting, partitions, earliest, latest, ending=False)
            end = _positions(o, client, o.ending, partitions, earliest, latest, ending=True)
        check_range(start, end, option_name(o.ending, True), option_name(o.starting, False))
        start = _skip_lost(o, start, earliest, end)
        return _input_partitions(start, end, o.max_transactions_per_split)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, WaltzInputPartition)
        yield from read_split(self.options, partition.split)


class WaltzStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are ``{"partition": next transaction ID}``; Spark checkpoints them, so a
    restarted query reads each committed transaction exactly once."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._client: BlockingWaltzClient | None = None
        self._log_starts: LogStarts | None = None
        self._target: dict[int, int] | None = None  # trigger(availableNow=True)

    def __getstate__(self) -> dict[str, Any]:  # executors get the options, not the clients
        return {"options": self.options, "_client": None, "_log_starts": None, "_target": None}

    def __repr__(self) -> str:
        return describe(self.options)

    def _starts(self) -> LogStarts:
        if self._log_starts is None:
            self._log_starts = LogStarts(self.options)
        return self._log_starts

    def _driver(self) -> BlockingWaltzClient:
        if self._client is None:
            self._client = _driver_client(self.options, self._starts())
        return self._client

    def _partitions(self) -> list[int]:
        return chosen_partitions(self.options.partitions, self._driver().num_partitions)

    def _earliest(self, partitions: list[int]) -> dict[int, int]:
        return self._starts().read(partitions)

    def _partitions_and_latest(self) -> tuple[list[int], dict[int, int]]:
        partitions = self._partitions()
        return partitions, _latest(self._driver(), partitions)

    def initialOffset(self) -> dict:
        """Where a new query starts (a restarted one resumes from its checkpoint, and
        Spark does not ask): startingOffsets, or the first transaction at or after
        startingTimestamp / startingOffsetsByTimestamp."""
        partitions = self._partitions()
        earliest = self._earliest(partitions)  # first: never beyond latest
        latest = _latest(self._driver(), partitions)
        start = _positions(
            self.options,
            self._driver(),
            self.options.starting,
            partitions,
            earliest,
            latest,
            ending=False,
        )
        return encode_offsets(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_transactions_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._partitions_and_latest()[1]

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = decode_offsets(start)
        partitions = self._partitions()
        earliest = self._earliest(partitions)  # first: never beyond latest
        latest = _latest(self._driver(), partitions)
        for p in partitions:
            begin.setdefault(p, earliest[p])  # a partition added since the query began
            if self._target is not None:
                latest[p] = min(latest[p], self._target.get(p, begin[p]))
        begin = {p: begin[p] for p in partitions}
        # Transactions gone since the last batch fail the query here, before a task runs;
        # with failOnDataLoss=false the limit counts from the log start, and partitions()
        # logs the skip when it plans the batch.
        for p in partitions:
            if begin[p] < earliest[p]:
                if self.options.fail_on_data_loss:
                    # Raises (unless this trigger wants none of them: availableNow).
                    skip_lost(self.options, p, begin[p], earliest[p], latest[p])
                begin[p] = earliest[p]
        if isinstance(limit, ReadMaxRows):
            end = limit_offsets(begin, latest, limit.max_rows)
        else:
            end = {p: max(begin[p], latest[p]) for p in partitions}
        return encode_offsets(end)

    def reportLatestOffset(self) -> dict | None:
        return encode_offsets(self._partitions_and_latest()[1])

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        finish = decode_offsets(end)
        earliest = self._earliest(sorted(finish))
        begin = {p: decode_offsets(start).get(p, earliest[p]) for p in finish}
        begin = _skip_lost(self.options, begin, earliest, finish)
        return _input_partitions(begin, finish, self.options.max_transactions_per_split)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, WaltzInputPartition)
        yield from read_split(self.options, partition.split)

    def commit(self, end: dict) -> None:
        """Nothing to do: the position is Spark's checkpoint (the log keeps no consumer
        position, and retention does not wait for readers)."""

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._log_starts is not None:
            self._log_starts.close()
            self._log_starts = None


class _RefusedStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A stream whose options were refused: every call raises the refusal (the first
    one Spark makes, as the query starts, fails it with the option's message)."""

    def __init__(self, error: WaltzOptionError) -> None:
        self.error = error

    def _refuse(self) -> Any:
        raise WaltzOptionError(str(self.error))

    def initialOffset(self) -> dict:
        return self._refuse()

    def getDefaultReadLimit(self) -> ReadLimit:
        return self._refuse()

    def prepareForTriggerAvailableNow(self) -> None:
        self._refuse()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        return self._refuse()

    def reportLatestOffset(self) -> dict | None:
        return self._refuse()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return self._refuse()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self._refuse()

    def commit(self, end: dict) -> None:
        self._refuse()

    def stop(self) -> None:
        pass
