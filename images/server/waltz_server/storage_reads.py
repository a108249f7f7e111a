"""Reads of a partition's committed transactions, for its feeds and its clients' reads.

The partition's caches answer first; otherwise a member of the running store session that
acknowledged what is asked reads it back, within the storage timeout: a wedged node must
not hold a feed or a client's read for ever (they retry, perhaps on another member).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Protocol, TypeVar

from waltz_client.runtime.tasks import wait_for
from waltz_client.wire.errors import describe
from waltz_client.wire.records import CRC, FORMAT_2, RecordBatch, UncheckedRecords

from .caches import DataCache, FeedCache
from .recovery_manager import RecoveryContext
from .store_session import StoreSession

log = logging.getLogger(__name__)
T = TypeVar("T")


class ReadSource(Protocol):
    """What reads need of a partition (partition.py implements it)."""

    partition_id: int
    feed_cache: FeedCache
    data_cache: DataCache
    log_start: int

    @property
    def session(self) -> StoreSession | None: ...

    @property
    def context(self) -> RecoveryContext: ...

    @property
    def high_water_mark(self) -> int: ...


async def _within_timeout(source: ReadSource, call: Awaitable[T]) -> T:
    timeout = source.context.connect_timeout
    try:
        return await wait_for(call, timeout)
    except TimeoutError:
        raise TimeoutError(
            f"partition {source.partition_id}: a storage read took more than {timeout:g} s"
        ) from None


async def read_headers(source: ReadSource, start: int, stop: int) -> list[bytes]:
    """Record headers ``start..stop`` for a feed, packed as ``TIMED_HEADER`` (the feed
    cache's); [] when none can be read now
    (after a short pause: the feed asks again)."""
    cached = source.feed_cache.get(start, stop)
    if cached is not None:
        return cached
    session = source.session
    member = session.reader(stop) if session is not None else None
    if member is None:
        await asyncio.sleep(0.05)
        return []
    try:
        headers = await _within_timeout(
            source,
            member.client.record_headers(
                session.session_id, source.partition_id, start, stop - start + 1
            ),
        )
    except Exception as e:
        log.info(
            "partition %d: feed read %d..%d failed: %s",
            source.partition_id,
            start,
            stop,
            describe(e),
        )
        await asyncio.sleep(0.1)
        return []
    return [h.encode(FORMAT_2) for h in headers if h.transaction_id <= stop]


async def transaction_data(source: ReadSource, txid: int) -> bytes:
    """Committed data of ``txid``. Raises LookupError (not committed) or RuntimeError."""
    hwm = source.high_water_mark
    if not 0 <= txid <= hwm:
        raise LookupError(f"transaction {txid} is not committed (high-water mark {hwm})")
    data = source.data_cache.get(txid)
    if data is not None:
        return data
    session = source.session
    member = session.reader(txid) if session is not None else None
    if member is None:
        raise RuntimeError(f"partition {source.partition_id} has no readable replica now")
    record = await _within_timeout(
        source, member.client.record(session.session_id, source.partition_id, txid)
    )
    source.data_cache.put(txid, record.data)
    return record.data


async def find_time(source: ReadSource, time_ms: int) -> tuple[int, int]:
    """(the first committed transaction at or after ``time_ms``, the high-water mark it was
    looked up against): a member's answer (from its segments' times), bounded to what is
    committed and served (the log start). RuntimeError when no member can answer."""
    hwm = source.high_water_mark
    session = source.session
    member = session.reader(hwm) if session is not None else None
    if member is None:
        raise RuntimeError(f"partition {source.partition_id} has no readable replica now")
    found = await _within_timeout(
        source, member.client.find_time(session.session_id, source.partition_id, time_ms)
    )
    return max(source.log_start, min(found, hwm + 1)), hwm


async def read_range(
    source: ReadSource, start: int, max_records: int, max_bytes: int
) -> RecordBatch | UncheckedRecords:
    """Committed records from ``start``, as a storage node read them. They are relayed
    unchecked when they fit in ``max_bytes``: the client checks every record itself
    (bounds, IDs, CRCs), and the storage node checked them on disk, so walking them
    here too only cost a core. Only a reply to cut short is decoded."""
    hwm = source.high_water_mark
    if start > hwm:
        return RecordBatch(b"", [])
    session = source.session
    member = session.reader(hwm) if session is not None else None
    p = source.partition_id
    if member is None:
        raise RuntimeError(f"partition {p} has no readable replica now")
    count = min(max_records, hwm - start + 1)  # so every record is committed
    records = await _within_timeout(
        source, member.client.records_unchecked(session.session_id, p, start, count)
    )
    if len(records) > count or (len(records) and records.first_txid != start):
        raise RuntimeError(
            f"partition {p}: storage {member.address} answered a read of "
            f"{count} from {start} with {len(records)} from {records.first_txid}"
        )
    if len(records.buf) <= max_bytes:  # data bytes are fewer than wire bytes
        return records
    return cut_to_bytes(records.check(), max_bytes)


def cut_to_bytes(batch: RecordBatch, max_bytes: int) -> RecordBatch:
    """The longest prefix of a non-empty ``batch`` whose data fits in ``max_bytes``, and at
    least its first record (a reply always makes progress)."""
    spans: list[tuple[int, int, int]] = []
    size = 0
    for span in batch.spans:
        if spans and size + span[2] > max_bytes:
            break
        spans.append(span)
        size += span[2]
    end = spans[-1][1] + batch.format.head_size + spans[-1][2] + CRC.size
    return RecordBatch(batch.buf[:end], spans, batch.format)
