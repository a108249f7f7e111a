"""A blocking facade over WaltzClient for threaded code (web apps, Spark executors).

The asyncio client runs on its own event-loop thread; every method here hands
the call to that loop and waits. Callbacks run as for the async client
(synchronous ones on worker threads).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

from .callbacks import WaltzClientCallbacks
from .client import SubmitResult, WaltzClient
from .config import WaltzClientConfig
from .runtime import event_loop
from .transaction import TransactionContext
from .wire.records import Record, RecordBatch, UncheckedRecords

T = TypeVar("T")


class BlockingWaltzClient:
    def __init__(
        self, config: WaltzClientConfig, callbacks: WaltzClientCallbacks | None = None
    ) -> None:
        client = WaltzClient(config, callbacks)  # bad arguments fail before a thread starts
        # uvloop where installed, as the daemons run: its transports read and write in C,
        # which is most of a bulk reader's loop (a Spark task's range reads).
        self._loop = event_loop.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="waltz-client-loop", daemon=True
        )
        self._thread.start()
        self.client = client
        try:
            self._call(self.client.start())
        except BaseException:
            self._stop_loop()
            raise

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def submit(self, context: TransactionContext, timeout: float | None = None) -> SubmitResult:
        return self._call(self.client.submit(context), timeout)

    def flush(self, timeout: float | None = None) -> None:
        self._call(self.client.flush(), timeout)

    def high_water_mark(self, partition_id: int) -> int:
        return self._call(self.client.high_water_mark(partition_id))

    def find_time(self, partition_id: int, timestamp_ms: int) -> int:
        """``WaltzClient.find_time``."""
        return self._call(self.client.find_time(partition_id, timestamp_ms))

    def transaction_data(self, partition_id: int, transaction_id: int) -> bytes:
        return self._call(self.client.transaction_data(partition_id, transaction_id))

    def read(self, partition_id: int, start: int = 0, stop: int | None = None) -> Iterator[Record]:
        """Committed records in order, fetched a batch at a time."""
        agen = self.client.read(partition_id, start, stop)
        while True:
            try:
                yield self._call(agen.__anext__())
            except StopAsyncIteration:
                return

    def read_batches(
        self,
        partition_id: int,
        start: int = 0,
        stop: int | None = None,
        *,
        batch_records: int = 1000,
        batch_bytes: int = 4 * 1024 * 1024,
        in_flight: int = 1,
        checked: bool = True,
    ) -> Iterator[RecordBatch | UncheckedRecords]:
        """``WaltzClient.read_batches``, with the next batch already on its way while
        the caller works on one."""
        agen = self.client.read_batches(
            partition_id,
            start,
            stop,
            batch_records=batch_records,
            batch_bytes=batch_bytes,
            in_flight=in_flight,
            checked=checked,
        )
        ahead = asyncio.run_coroutine_threadsafe(agen.__anext__(), self._loop)
        try:
            while True:
                try:
                    batch = ahead.result()
                except StopAsyncIteration:
                    return
                ahead = asyncio.run_coroutine_threadsafe(agen.__anext__(), self._loop)
                yield batch
        finally:
            ahead.cancel()
            if not self._loop.is_closed():
                with contextlib.suppress(Exception):
                    self._call(agen.aclose(), 10)

    @property
    def num_partitions(self) -> int:
        return self.client.num_partitions

    def close(self) -> None:
        try:
            self._call(self.client.close(), 30)
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> BlockingWaltzClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
