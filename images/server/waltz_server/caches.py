"""The partition's two caches of committed transactions, each bounded in bytes.

The feed cache keeps the packed headers (transaction ID, ReqId, header, commit
time: ``TIMED_HEADER``) of the latest committed transactions, contiguous up to
the high-water mark, so feeds near the head never touch storage. The data cache keeps recently
committed transaction data for lazy fetches, least recently used out first.
Pure: no I/O, no clocks.
"""

from __future__ import annotations

import builtins  # FeedCache.bytes (a property) hides the type in its class's annotations
from collections import OrderedDict

from waltz_client.wire.records import TIMED_HEADER

HEADER_BYTES = TIMED_HEADER.size
_ENTRY_OVERHEAD = 64  # what a cached bytes object costs beyond its payload, roughly


class FeedCache:
    def __init__(self, max_bytes: int) -> None:
        self._entries: list[bytes] = []
        self._base = 0  # transaction ID of _entries[0]
        self.resize(max_bytes)

    def resize(self, max_bytes: int) -> None:
        """A new bound (the server's memory budget changed); the oldest go at once."""
        self.max_bytes = max_bytes
        # Trimming happens at twice max_entries (amortised O(1) per add), so that bound,
        # not max_entries, is what has to fit in max_bytes.
        self.max_entries = max(1, max_bytes // (2 * (HEADER_BYTES + _ENTRY_OVERHEAD)))
        if len(self._entries) > self.max_entries:
            drop = len(self._entries) - self.max_entries
            del self._entries[:drop]
            self._base += drop

    @property
    def first(self) -> int:
        return self._base

    @property
    def last(self) -> int:
        return self._base + len(self._entries) - 1

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        return len(self._entries) * (HEADER_BYTES + _ENTRY_OVERHEAD)

    def reset(self, high_water_mark: int) -> None:
        """After recovery: empty, expecting ``high_water_mark + 1`` next."""
        self._entries = []
        self._base = high_water_mark + 1

    def add(self, transaction_id: int, packed_header: builtins.bytes) -> None:
        if transaction_id != self.last + 1:
            raise ValueError(
                f"feed cache expects transaction {self.last + 1}, got {transaction_id}"
            )
        self._entries.append(packed_header)
        if len(self._entries) > 2 * self.max_entries:
            drop = len(self._entries) - self.max_entries  # amortised O(1) per add
            del self._entries[:drop]
            self._base += drop

    def get(self, start: int, stop: int) -> list[builtins.bytes] | None:
        """Packed headers for ``start..stop`` (inclusive), or None unless all are cached."""
        if start < self._base or stop > self.last or start > stop:
            return None
        return self._entries[start - self._base : stop - self._base + 1]


class DataCache:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._data: OrderedDict[int, bytes] = OrderedDict()

    def __len__(self) -> int:
        return len(self._data)

    def clear(self) -> None:
        self._data.clear()
        self.bytes = 0

    def put(self, transaction_id: int, data: bytes) -> None:
        old = self._data.pop(transaction_id, None)
        if old is not None:
            self.bytes -= len(old) + _ENTRY_OVERHEAD
        size = len(data) + _ENTRY_OVERHEAD
        if size > self.max_bytes:
            return
        self._data[transaction_id] = data
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, evicted = self._data.popitem(last=False)
            self.bytes -= len(evicted) + _ENTRY_OVERHEAD

    def get(self, transaction_id: int) -> bytes | None:
        data = self._data.get(transaction_id)
        if data is None:
            self.misses += 1
            return None
        self._data.move_to_end(transaction_id)
        self.hits += 1
        return data

    def resize(self, max_bytes: int) -> None:
        """A new bound (the server's memory budget changed); least recently used go."""
        self.max_bytes = max_bytes
        while self.bytes > self.max_bytes and self._data:
            _, evicted = self._data.popitem(last=False)
            self.bytes -= len(evicted) + _ENTRY_OVERHEAD

    def drop_above(self, high_water_mark: int) -> None:
        for txid in [t for t in self._data if t > high_water_mark]:
            self.bytes -= len(self._data.pop(txid)) + _ENTRY_OVERHEAD

    def drop_below(self, log_start: int) -> None:
        for txid in [t for t in self._data if t < log_start]:
            self.bytes -= len(self._data.pop(txid)) + _ENTRY_OVERHEAD
