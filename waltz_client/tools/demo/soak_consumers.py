"""The consumers of ``waltz soak``: feed consumers that keep up, and slow ones, paced
below the load, that alternate between the feed and range reads. Each counts what it
consumed and, once retention has deleted what it had not read yet, the skip to the first
available transaction (``Consumer``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from waltz_client.callbacks import WaltzClientCallbacks
from waltz_client.client import MissingTransactions, WaltzClient, WaltzError
from waltz_client.config import WaltzClientConfig
from waltz_client.transaction import Transaction
from waltz_client.wire.records import RecordBatch, UncheckedRecords


class _Pacer:
    """At most ``rate`` a second on average (0: no limit), with at most a second of
    credit: a consumer held up (a refused mount) does not then race to catch up."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.due = 0.0

    async def take(self, n: int) -> None:
        if self.rate <= 0:
            return
        now = time.monotonic()
        self.due = max(self.due, now - 1.0) + n / self.rate
        if self.due - now > 0.002:
            await asyncio.sleep(self.due - now)


@dataclass
class Consumer:
    """One consumer's progress: ``applied[p]`` is the last transaction it consumed of
    partition ``p``."""

    name: str
    kind: str  # "feed" or "range"
    rate: float  # 0: as fast as it comes
    partitions: int
    consumed: int = 0
    data_bytes: int = 0  # transaction data read (slow consumers)
    skips: int = 0  # times it fell below the log start
    skipped: int = 0  # transactions it never saw because of that
    errors: int = 0  # reads that failed otherwise (retried)
    applied: dict[int, int] = field(default_factory=dict)

    def behind(self, hwms: dict[int, int]) -> int:
        return sum(max(0, h - self.applied.get(p, -1)) for p, h in hwms.items())

    def skip(self, p: int, first_available: int) -> None:
        gone = first_available - 1 - self.applied.get(p, -1)
        if gone > 0:
            self.skips += 1
            self.skipped += gone
            self.applied[p] = first_available - 1


class _FeedCallbacks(WaltzClientCallbacks):
    """A feed consumer: counts each transaction, paced. A slow one also fetches each
    transaction's data, as an application that needs it does: the feed may have
    delivered headers (buffered in this client) of transactions that retention has
    since deleted, and the fetch is what finds out. It then raises, the client mounts
    again, and ``skip_to`` is where the new mount starts (``_watch_feed`` sets it too,
    for a mount refused outright)."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self.pacer = _Pacer(consumer.rate)
        self.fetch = consumer.rate > 0
        self.skip_to: dict[int, int] = {}

    async def client_high_water_mark(self, partition_id: int) -> int:
        c = self.consumer
        first_available = self.skip_to.pop(partition_id, None)
        if first_available is not None:
            c.skip(partition_id, first_available)
        return c.applied.get(partition_id, -1)

    async def apply_transaction(self, transaction: Transaction) -> None:
        c = self.consumer
        if self.fetch:
            try:
                c.data_bytes += len(await transaction.data())
            except MissingTransactions as e:
                self.skip_to[transaction.partition_id] = e.first_available
                raise
        c.applied[transaction.partition_id] = transaction.transaction_id
        c.consumed += 1
        await self.pacer.take(1)

    def uncaught_exception(
        self, partition_id: int, transaction_id: int, error: BaseException
    ) -> None:
        if isinstance(error, MissingTransactions):
            return  # expected of a slow consumer, and counted
        self.consumer.errors += 1
        super().uncaught_exception(partition_id, transaction_id, error)


async def _first_batch(
    client: WaltzClient, p: int, start: int, records: int
) -> RecordBatch | UncheckedRecords | None:
    """The first batch of a range read from ``start`` (None at the end of the log)."""
    batches = client.read_batches(p, start, batch_records=records)
    try:
        return await anext(batches, None)
    finally:
        await batches.aclose()


async def _watch_feed(client: WaltzClient, callbacks: _FeedCallbacks, stop: asyncio.Event) -> None:
    """A feed consumer whose partition made no progress for a while may be below the log
    start (its mount refused): a one-record range read says so, and where the log starts
    now; its next mount starts there."""
    c = callbacks.consumer
    last: dict[int, int] = {}
    while not stop.is_set():
        await asyncio.sleep(2.0)
        for p in range(c.partitions):
            applied = c.applied.get(p, -1)
            if last.get(p) == applied:
                try:
                    await _first_batch(client, p, applied + 1, 1)
                except MissingTransactions as e:
                    callbacks.skip_to[p] = e.first_available
                except WaltzError:
                    pass
            last[p] = applied


async def _range_reader(client: WaltzClient, c: Consumer, stop: asyncio.Event) -> None:
    """Range reads over every partition in turn, a batch at a time, paced; records are
    decoded and their data touched, as an application would."""
    pacer = _Pacer(c.rate)
    while not stop.is_set():
        progressed = False
        for p in range(c.partitions):
            start = c.applied.get(p, -1) + 1
            try:
                batch = await _first_batch(client, p, start, 100)
            except MissingTransactions as e:
                c.skip(p, e.first_available)
                continue
            except WaltzError:
                c.errors += 1
                await asyncio.sleep(1.0)
                continue
            if batch is None:
                continue
            n = 0
            for record in batch.records():
                n += 1
                c.data_bytes += len(record.data)
            c.applied[p] = batch.last_txid
            c.consumed += n
            progressed = True
            await pacer.take(n)
            if stop.is_set():
                return
        if not progressed:
            await asyncio.sleep(0.2)


class BelowLogStart(logging.Filter):
    """The client logs a refused mount below the log start as an error; here that is
    expected (slow consumers), and counted instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "below the log start" not in record.getMessage()


def make_consumers(live: int, slow: int, slow_rate: float, partitions: int) -> list[Consumer]:
    """``live`` feed consumers, then ``slow`` ones alternately reading the feed and ranges."""
    consumers = [Consumer(f"live-{i}", "feed", 0.0, partitions) for i in range(live)]
    for i in range(slow):
        kind = "feed" if i % 2 == 0 else "range"
        consumers.append(Consumer(f"slow-{i}", kind, slow_rate, partitions))
    return consumers


async def start_consumer(
    c: Consumer, config: Callable[[bool], WaltzClientConfig], stop: asyncio.Event
) -> tuple[WaltzClient, asyncio.Task[None]]:
    """A started client for ``c`` (``config(feed)`` configures it), and the task that
    reads for it (a range reader) or watches its feed, until ``stop``."""
    if c.kind == "feed":
        callbacks = _FeedCallbacks(c)
        client = await WaltzClient(config(True), callbacks).start()
        return client, asyncio.create_task(_watch_feed(client, callbacks, stop))
    client = await WaltzClient(config(False)).start()
    return client, asyncio.create_task(_range_reader(client, c, stop))
