"""Copying a lagging replica in the background while the partition keeps committing.

Recovery leaves out of a new store session any replica further behind the decided
high-water mark than ``inline_records`` when the others already make a quorum (a new
replica, one back after a long absence): copying it there would stop writes for the
whole copy. It truncates the replica to its clean position and sets its low-water mark,
so its log is a committed prefix; this task then copies the rest from a member of the
running session, on connections of its own, with several reads and appends in flight,
at most ``rate`` bytes a second. It copies only committed transactions, so the log stays
a committed prefix, and it sets the low-water mark again every ``mark_interval``
seconds, so a later recovery sees the replica as cleaned (its whole log committed) and
keeps what was copied. Once the replica is within ``join_lag`` transactions of the
high-water mark, the partition ends the session at a planned boundary and the next
recovery copies the remainder inline and makes the replica a member.

The decisions (how much to read next, how long the rate limit waits, when the replica
may join) are pure; ``CatchUp`` is the I/O shell.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from waltz_client.runtime.tasks import wait_for
from waltz_client.wire.errors import describe
from waltz_client.wire.framing import OpenConnection
from waltz_client.wire.records import RecordBatch
from waltz_client.wire.storage_client import StorageClient, StorageFailure
from waltz_client.wire.storage_messages import FailureResponse

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CatchUpSettings:
    inline_records: int = 5_000  # recovery copies a gap this small itself
    chunk_records: int = 2_000  # records one read asks for
    depth: int = 4  # reads (and appends) in flight
    rate: int = 128 * 1024 * 1024  # bytes a second; 0: unlimited
    mark_interval: float = 1.0  # seconds between low-water marks on the copy

    @property
    def join_lag(self) -> int:
        """Close enough to join: the next recovery copies the rest inline."""
        return max(1, self.inline_records // 2)


class TokenBucket:
    """A rate limit in bytes a second, with up to one second's worth of burst. Pure: the
    caller passes the time."""

    def __init__(self, rate: int, now: float) -> None:
        self.rate = rate
        self._tokens = float(rate)
        self._at = now

    def delay(self, size: int, now: float) -> float:
        """Take ``size`` bytes; how long to wait before sending them (0: now)."""
        if self.rate <= 0:
            return 0.0
        self._tokens = min(float(self.rate), self._tokens + (now - self._at) * self.rate)
        self._at = now
        self._tokens -= size
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate


def next_read(next_txid: int, committed: int, chunk: int) -> int:
    """How many transactions to read from ``next_txid`` on: only committed ones."""
    return max(0, min(chunk, committed - next_txid + 1))


def may_join(copied_through: int, committed: int, join_lag: int) -> bool:
    return committed - copied_through <= join_lag


class CatchUpFailed(Exception):
    pass


@dataclass
class CatchUpProgress:
    copied_through: int
    copied: int = 0  # transactions copied by this task
    started: float = 0.0


class CatchUp:
    """Copies one replica from ``position + 1`` up to the partition's high-water mark,
    under ``session_id``; calls ``on_caught_up(address)`` when it may join."""

    def __init__(
        self,
        *,
        partition_id: int,
        session_id: int,
        address: str,
        position: int,
        source: Callable[[], str | None],
        committed: Callable[[], int],
        on_caught_up: Callable[[str], None],
        cluster_key: uuid.UUID,
        num_partitions: int,
        timeout: float,
        settings: CatchUpSettings,
        open_connection: OpenConnection = asyncio.open_connection,
    ) -> None:
        self.partition_id = partition_id
        self.session_id = session_id
        self.address = address
        self._source = source
        self._committed = committed
        self._on_caught_up = on_caught_up
        self._key = cluster_key
        self._num_partitions = num_partitions
        self._timeout = timeout
        self.settings = settings
        self._open_connection = open_connection
        self.progress = CatchUpProgress(position, started=asyncio.get_running_loop().time())
        self.task = asyncio.get_running_loop().create_task(self._run())
        self.task.add_done_callback(self._finished)

    def cancel(self) -> None:
        self.task.cancel()

    def _finished(self, task: asyncio.Task) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            log.warning(
                "partition %d: catching up replica %s stopped at %d: %s",
                self.partition_id,
                self.address,
                self.progress.copied_through,
                describe(error),
            )

    async def _connect(self, address: str) -> StorageClient:
        host, _, port = address.rpartition(":")
        client = await StorageClient.connect(
            host, int(port), timeout=self._timeout, open_connection=self._open_connection
        )
        try:
            await wait_for(client.open(self._key, self._num_partitions), self._timeout)
        except BaseException:
            await client.close()
            raise
        return client

    async def _run(self) -> None:
        source_address = self._source()
        if source_address is None:
            raise CatchUpFailed("no member to copy from")
        target = await self._connect(self.address)
        try:
            source = await self._connect(source_address)
            try:
                await self._copy(source, target)
            finally:
                await source.close()
        finally:
            await target.close()

    async def _copy(self, source: StorageClient, target: StorageClient) -> None:
        log.info(
            "partition %d: catching up replica %s from %d (high-water mark %d) in session %d",
            self.partition_id,
            self.address,
            self.progress.copied_through + 1,
            self._committed(),
            self.session_id,
        )
        batches: asyncio.Queue[RecordBatch] = asyncio.Queue(self.settings.depth)
        reader = asyncio.get_running_loop().create_task(self._read(source, batches))
        try:
            await self._write(target, batches, reader)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader

    async def _read(self, source: StorageClient, batches: asyncio.Queue[RecordBatch]) -> None:
        """Committed transactions from the source, in order, a chunk at a time."""
        p, s, cfg = self.partition_id, self.session_id, self.settings
        next_txid = self.progress.copied_through + 1
        while True:
            count = next_read(next_txid, self._committed(), cfg.chunk_records)
            if count == 0:
                await asyncio.sleep(0.05)  # nothing new committed yet
                continue
            batch = await wait_for(source.records(s, p, next_txid, count), self._timeout)
            if not len(batch) or batch.first_txid != next_txid:
                raise CatchUpFailed(f"the source returned {batch!r} for {next_txid}")
            next_txid = batch.last_txid + 1  # a short answer (a size limit) is fine
            await batches.put(batch)

    async def _write(
        self,
        target: StorageClient,
        batches: asyncio.Queue[RecordBatch],
        reader: asyncio.Task,
    ) -> None:
        """Appends with up to ``depth`` in flight, rate-limited; returns once the replica
        may join."""
        cfg = self.settings
        loop = asyncio.get_running_loop()
        bucket = TokenBucket(cfg.rate, loop.time())
        in_flight: deque[tuple[int, asyncio.Future]] = deque()
        marked_at = loop.time()
        while True:
            if reader.done():
                reader.result()  # raises what stopped it
                raise CatchUpFailed("the reader stopped")
            if (
                not in_flight
                and batches.empty()
                and may_join(self.progress.copied_through, self._committed(), cfg.join_lag)
            ):
                await self._mark(target)
                self._report_done()
                self._on_caught_up(self.address)
                return
            if in_flight and (len(in_flight) >= cfg.depth or batches.empty()):
                last, future = in_flight.popleft()
                _check(await wait_for(future, self._timeout))
                self.progress.copied += last - self.progress.copied_through
                self.progress.copied_through = last
                if loop.time() - marked_at >= cfg.mark_interval:
                    await self._mark(target)
                    marked_at = loop.time()
                continue
            try:
                batch = await wait_for(batches.get(), 0.1)
            except TimeoutError:
                continue
            wait = bucket.delay(len(batch.buf), loop.time())
            if wait > 0:
                await asyncio.sleep(wait)
            request = target.append_request(self.session_id, self.partition_id, batch)
            in_flight.append((batch.last_txid, target.submit(request)))

    async def _mark(self, target: StorageClient) -> None:
        """The copy so far is a committed prefix: say so durably (the next recovery keeps
        it)."""
        await wait_for(
            target.set_low_water_mark(
                self.session_id, self.partition_id, self.progress.copied_through
            ),
            self._timeout,
        )

    def _report_done(self) -> None:
        took = max(1e-9, asyncio.get_running_loop().time() - self.progress.started)
        log.info(
            "partition %d: replica %s caught up to %d: %d transactions in %.2f s (%.0f/s)",
            self.partition_id,
            self.address,
            self.progress.copied_through,
            self.progress.copied,
            took,
            self.progress.copied / took,
        )


def _check(response: object) -> None:
    if isinstance(response, FailureResponse):
        raise StorageFailure(response.error, response.message)
