"""Requests a partition's owner answers on the RPC connection: high-water marks,
transaction data and range reads. Each finds the owner in ZooKeeper's view, retries
(with backoff) while the partition moves or recovers, and gives up after
``request_timeout``; range reads check that the log has no holes."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncGenerator, Callable

from .cluster_view import ClusterView
from .config import WaltzClientConfig
from .errors import Forbidden, MissingTransactions, WaltzError, truncated
from .server_link import ServerLink
from .submit_policy import Backoff
from .wire.client_messages import (
    COMMIT_TIME_VERSION,
    ClientMessage,
    ErrorCode,
    ErrorResponse,
    FindTimeRequest,
    FindTimeResponse,
    HighWaterMarkRequest,
    HighWaterMarkResponse,
    ReadRangeRequest,
    ReadRangeResponse,
    TransactionDataRequest,
    TransactionDataResponse,
)
from .wire.errors import MalformedMessage
from .wire.records import (
    DEFAULT_FORMAT,
    DEFAULT_MAX_DATA_BYTES,
    Record,
    RecordBatch,
    ReqId,
    UncheckedRecords,
)

# Answers that mean "ask again, maybe elsewhere": the partition moved or is recovering.
_RETRIED = (ErrorCode.NOT_OWNER, ErrorCode.NOT_READY, ErrorCode.STORAGE_UNAVAILABLE)


class PartitionRpc:
    def __init__(
        self,
        config: WaltzClientConfig,
        view: ClusterView,
        link_to: Callable[[str], ServerLink],
        next_seq: Callable[[], int],
        is_closed: Callable[[], bool],
    ) -> None:
        self.config = config
        self.view = view
        self._link_to = link_to
        self._next_seq = next_seq
        self._is_closed = is_closed

    async def call(
        self,
        partition_id: int,
        make: Callable[[ReqId], ClientMessage],
        *,
        requested: int = 0,  # the transaction asked for (for a TRUNCATED answer)
        min_version: int = 1,  # the client protocol version the request needs
    ) -> ClientMessage:
        """The owner's answer to ``make(req_id)``, asked again (maybe elsewhere) while the
        partition moves or recovers; ``WaltzError`` when none came in time, or at once
        when the owner speaks a protocol older than ``min_version``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.request_timeout
        backoff = Backoff(self.config.retry_backoff)
        last = "no owner"
        while loop.time() < deadline:
            if self._is_closed():
                raise WaltzError("the client is closed")
            owner = self.view.owner(partition_id)
            if owner is None:
                await self.view.changed(min(1.0, backoff.current))
                continue
            endpoint, generation = owner
            q = ReqId(self.view.client_id, generation, partition_id, self._next_seq())
            link = self._link_to(endpoint)
            try:
                conn = await link.rpc_connection()
                if conn.protocol_version < min_version:
                    raise WaltzError(
                        f"partition {partition_id}: server {endpoint} speaks client protocol "
                        f"{conn.protocol_version}, and {type(make(q)).__name__} needs "
                        f"{min_version}: upgrade the servers"
                    )
                remaining = max(0.1, deadline - loop.time())
                answer = await link.ask(conn, make(q), remaining)
            except (OSError, ConnectionError, TimeoutError) as e:
                last = f"{endpoint}: {e or type(e).__name__}"
            else:
                if not isinstance(answer, ErrorResponse):
                    return answer
                last = f"{endpoint}: {answer.code.name}: {answer.message}"
                if answer.code not in _RETRIED:
                    if answer.code == ErrorCode.TRUNCATED:
                        raise truncated(partition_id, requested, answer)
                    raise (Forbidden if answer.code == ErrorCode.FORBIDDEN else WaltzError)(last)
            await asyncio.sleep(backoff.grow())
        raise WaltzError(f"partition {partition_id}: no answer in time ({last})")

    async def high_water_mark(self, partition_id: int) -> int:
        answer = await self.call(partition_id, HighWaterMarkRequest)
        assert isinstance(answer, HighWaterMarkResponse)
        return answer.transaction_id

    async def find_time(self, partition_id: int, time_ms: int) -> int:
        """``WaltzClient.find_time``."""
        answer = await self.call(
            partition_id, lambda q: FindTimeRequest(q, time_ms), min_version=COMMIT_TIME_VERSION
        )
        assert isinstance(answer, FindTimeResponse)
        return answer.transaction_id

    async def transaction_data(self, partition_id: int, transaction_id: int) -> bytes:
        answer = await self.call(
            partition_id,
            lambda q: TransactionDataRequest(q, transaction_id),
            requested=transaction_id,
        )
        assert isinstance(answer, TransactionDataResponse)
        if answer.data is None:
            raise LookupError(answer.error)
        return answer.data

    async def read(
        self,
        partition_id: int,
        start: int,
        stop: int | None,
        *,
        batch_records: int,
        batch_bytes: int,
    ) -> AsyncGenerator[Record, None]:
        async for batch in self.read_batches(
            partition_id, start, stop, batch_records=batch_records, batch_bytes=batch_bytes
        ):
            for record in batch.records():
                yield record

    async def read_batches(
        self,
        partition_id: int,
        start: int,
        stop: int | None,
        *,
        batch_records: int,
        batch_bytes: int,
        in_flight: int = 1,
        checked: bool = True,
    ) -> AsyncGenerator[RecordBatch | UncheckedRecords, None]:
        """``WaltzClient.read_batches``."""
        if (
            start < 0
            or batch_records < 1
            or batch_bytes < 1
            or in_flight < 1
            or (stop is not None and stop < -1)
        ):
            raise ValueError(
                f"read({partition_id}, {start}, {stop}): need start >= 0, stop >= -1 and "
                f"positive batch sizes and in_flight"
            )
        if stop is not None and in_flight > 1:
            async for batch in self._read_pipelined(
                partition_id, start, stop, batch_records, batch_bytes, in_flight, checked
            ):
                yield batch
            return
        next_txid = start
        while stop is None or next_txid <= stop:
            count = batch_records if stop is None else min(batch_records, stop - next_txid + 1)
            batch = await self.read_range(
                partition_id, next_txid, count, batch_bytes, stop, checked
            )
            if batch is None:
                return
            yield batch
            next_txid = batch.last_txid + 1

    async def read_range(
        self,
        partition_id: int,
        first: int,
        count: int,
        batch_bytes: int,
        stop: int | None,
        checked: bool = True,
    ) -> RecordBatch | UncheckedRecords | None:
        """One range read from ``first``; None at the end of the log (no ``stop``)."""
        answer = await self.call(
            partition_id, lambda q: ReadRangeRequest(q, first, count, batch_bytes), requested=first
        )
        assert isinstance(answer, ReadRangeResponse)
        batch = answer.records
        if not len(batch):
            if stop is not None and stop > answer.high_water_mark:
                raise WaltzError(
                    f"partition {partition_id}: transaction {stop} is not committed "
                    f"(high-water mark {answer.high_water_mark})"
                )
            return None
        if checked:
            if isinstance(batch, UncheckedRecords):
                batch = batch.check(DEFAULT_MAX_DATA_BYTES)
            # Format 2 always: an older server's format-1 records get NO_TIMESTAMP here.
            batch = batch.convert(DEFAULT_FORMAT)
        first_txid = batch.first_txid
        if first_txid is None:  # unchecked, and not even one record's ID: a bad reply
            raise MalformedMessage(f"range read: {len(batch)} records in {len(batch.buf)} bytes")
        if first_txid != first:
            raise MissingTransactions(partition_id, first, first_txid)
        return batch

    async def _read_pipelined(
        self,
        partition_id: int,
        start: int,
        stop: int,
        batch_records: int,
        batch_bytes: int,
        in_flight: int,
        checked: bool = True,
    ) -> AsyncGenerator[RecordBatch | UncheckedRecords, None]:
        pending: collections.deque[tuple[int, int, asyncio.Task]] = collections.deque()
        next_txid = start
        try:
            while pending or next_txid <= stop:
                while len(pending) < in_flight and next_txid <= stop:
                    count = min(batch_records, stop - next_txid + 1)
                    task = asyncio.ensure_future(
                        self.read_range(partition_id, next_txid, count, batch_bytes, stop, checked)
                    )
                    pending.append((next_txid, count, task))
                    next_txid += count
                first, count, task = pending.popleft()
                batch = await task
                if batch is None:  # stop is above the high-water mark: read_range raised
                    return
                yield batch
                # A response cut short by batch_bytes: the rest of its range, in order.
                rest = batch.last_txid + 1
                while rest < first + count:
                    more = await self.read_range(
                        partition_id, rest, first + count - rest, batch_bytes, stop, checked
                    )
                    assert more is not None
                    yield more
                    rest = more.last_txid + 1
        finally:
            for _, _, task in pending:
                task.cancel()
