"""Transactions gone from the start of a partition (retention): the read fails naming
the first available ID, or with failOnDataLoss=false skips them and says how many.

The log here is a stand-in that starts at a given ID and answers as the client's range
reader does; test_retention.py does the same on a real cluster with retention."""

from __future__ import annotations

import logging

import pytest

from waltz_client.client import MissingTransactions, WaltzError
from waltz_client.spark.options import parse_read_options
from waltz_client.spark.planning import Split
from waltz_client.spark.split_reader import read_split
from waltz_client.wire.records import Record, RecordBatch, ReqId, UncheckedRecords


class LogStartingAt:
    """Transactions ``first..`` of partition 0, read as BlockingWaltzClient.read_batches."""

    def __init__(self, first: int) -> None:
        self.first = first

    def read_batches(
        self, partition_id, start, stop, *, batch_records, batch_bytes, in_flight, checked
    ):
        if start < self.first:
            raise MissingTransactions(partition_id, start, self.first)
        for low in range(start, stop + 1, batch_records):
            high = min(stop, low + batch_records - 1)
            batch = RecordBatch.from_records(
                [Record(t, ReqId(1, 1, 0, t), t, b"x") for t in range(low, high + 1)]
            )
            yield batch if checked else UncheckedRecords(batch.buf, len(batch))


def options(**more):
    return parse_read_options(
        {"zookeeper": "unused:1", "fetchRecords": "7", **more}, streaming=False
    )


def test_missing_transactions_fail_the_read_naming_the_first_available():
    with pytest.raises(WaltzError) as e:
        list(read_split(options(), Split(0, 10, 50), LogStartingAt(30)))
    assert "transactions 10..29 are no longer in the log; the first available is 30" in str(e.value)
    assert "failOnDataLoss=false" in str(e.value)


def test_without_fail_on_data_loss_the_read_skips_ahead_and_logs_it(caplog):
    with caplog.at_level(logging.WARNING):
        batches = list(
            read_split(options(failOnDataLoss="false"), Split(0, 10, 50), LogStartingAt(30))
        )
    ids = [t for b in batches for t in b.column("transaction_id").to_pylist()]
    assert ids == list(range(30, 50))
    assert "skipped 20 transactions (10..29)" in caplog.text
    # A split entirely below the retention mark reads nothing, and says so.
    assert (
        list(read_split(options(failOnDataLoss="false"), Split(0, 0, 5), LogStartingAt(30))) == []
    )
