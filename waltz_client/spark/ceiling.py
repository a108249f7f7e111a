"""``waltz-ceiling``: a Python data source with the ``waltz`` schema that reads nothing.

Its tasks yield ready-made Arrow batches of the size a waltz read yields, so a query
over it measures what Spark itself costs on this machine for the same rows: the
ceiling any Python data source can reach here (``waltz spark bench --ceiling``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from .arrow import ARROW_SCHEMA, SCHEMA_DDL, TIMESTAMP_TYPE


class _Rows(InputPartition):
    def __init__(self, rows: int) -> None:
        super().__init__(rows)
        self.rows = rows


class CeilingDataSource(DataSource):
    """Options: ``rows`` in all, ``splits`` tasks, ``size`` bytes of data a row,
    ``batch`` rows an Arrow batch."""

    @classmethod
    def name(cls) -> str:
        return "waltz-ceiling"

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        return _CeilingReader(
            int(self.options.get("rows", 1_000_000)),
            int(self.options.get("splits", 12)),
            int(self.options.get("size", 1024)),
            int(self.options.get("batch", 2000)),
        )


class _CeilingReader(DataSourceReader):
    def __init__(self, rows: int, splits: int, size: int, batch: int) -> None:
        self.rows, self.splits, self.size, self.batch = rows, splits, size, batch

    def partitions(self) -> Sequence[InputPartition]:
        return [
            _Rows(self.rows * (i + 1) // self.splits - self.rows * i // self.splits)
            for i in range(self.splits)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _Rows)
        full = _batch(self.batch, self.size)
        for _ in range(partition.rows // self.batch):
            yield full
        if partition.rows % self.batch:
            yield _batch(partition.rows % self.batch, self.size)


def _batch(rows: int, size: int) -> pa.RecordBatch:
    data = pa.Array.from_buffers(
        pa.binary(),
        rows,
        [
            None,
            pa.py_buffer(np.arange(rows + 1, dtype=np.int32) * size),
            pa.py_buffer(np.random.default_rng(rows).bytes(rows * size)),
        ],
    )
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.zeros(rows, dtype=np.int32)),
            pa.array(np.arange(rows, dtype=np.int64)),
            pa.array(np.zeros(rows, dtype=np.int32)),
            data,
            pa.array(np.zeros(rows, dtype=np.int64)),
            pa.array(np.arange(rows, dtype=np.int64) + 1_700_000_000_000_000, TIMESTAMP_TYPE),
        ],
        schema=ARROW_SCHEMA,
    )
