"""The optimistic lock table of one partition (the spec's "Concurrency Control").

A fixed array of high-water marks and N hash functions. The estimated
high-water mark of a lock is the minimum of its N entries: never below the
last transaction that took the lock (no false negatives), sometimes above it
when other locks share entries (a false conflict, rarer with a larger array).
An append is safe when the client's high-water mark is at or above the
estimate of every lock it names; an append raises its locks' entries when it is
assigned its transaction ID.

A new store session either keeps the table (``truncate``: only the transactions the
recovery dropped are forgotten) or resets it (``reset``: every lock as new as the
log). Neither touches the whole array: a reset raises a floor under every entry, and
a truncation lowers only the entries that transactions not yet committed raised.
Pure and deterministic.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Iterable

_MASK64 = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finaliser: spreads nearby lock hashes over the whole table."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


class LockTable:
    def __init__(self, size: int = 1 << 16, hashes: int = 3) -> None:
        if size < 1 or hashes < 1:
            raise ValueError(f"lock table size and hash count must be >= 1, got {size}, {hashes}")
        self.size = size
        self.hashes = hashes
        # Allocated at the first lock taken: 512 KiB at the default size, written through,
        # and a server that takes a hundred partitions at once allocated every one before
        # it recovered any. Until then every entry reads as the floor.
        self._marks: array[int] | None = None
        # Every entry reads as at least this: reset() raises it instead of rewriting
        # the array (a Python-speed pass over 2^26 entries would stall the event loop).
        self._floor = -1
        # Transactions whose locks were taken but which are not known to be committed,
        # in ID order, with the locks they took: truncate() lowers what they raised.
        self._unsettled: deque[tuple[int, tuple[int, ...]]] = deque()

    def _slots(self, lock_hash: int) -> list[int]:
        base = _mix(lock_hash & 0xFFFFFFFF)
        return [_mix(base + i) % self.size for i in range(self.hashes)]

    def estimate(self, lock_hash: int) -> int:
        """Upper bound of the last transaction that took this lock (-1: none)."""
        marks = self._marks
        if marks is None:
            return self._floor
        mark = min(marks[s] for s in self._slots(lock_hash))
        return mark if mark > self._floor else self._floor

    def conflict(self, client_high_water_mark: int, lock_hashes: Iterable[int]) -> int | None:
        """The transaction ID that makes the append unsafe, or None when it is safe."""
        worst = None
        for h in lock_hashes:
            estimate = self.estimate(h)
            if estimate > client_high_water_mark and (worst is None or estimate > worst):
                worst = estimate
        return worst

    def commit(self, transaction_id: int, lock_hashes: Iterable[int]) -> None:
        """Transaction ``transaction_id`` takes ``lock_hashes`` (at assignment: it may
        still be lost, until ``settled``)."""
        hashes = tuple(lock_hashes)  # a tuple already: no copy
        if not hashes:
            return
        marks = self._marks
        if marks is None:
            marks = self._marks = array("q", [self._floor]) * self.size
        for h in hashes:
            for s in self._slots(h):
                if marks[s] < transaction_id:
                    marks[s] = transaction_id
        self._unsettled.append((transaction_id, hashes))

    def settled(self, high_water_mark: int) -> None:
        """Everything up to ``high_water_mark`` committed: no truncation will drop it."""
        unsettled = self._unsettled
        while unsettled and unsettled[0][0] <= high_water_mark:
            unsettled.popleft()

    def truncate(self, high_water_mark: int) -> None:
        """Nothing above ``high_water_mark`` exists (a recovery dropped what the last
        session had not committed): lower the entries those transactions raised to the
        mark. Their IDs are given again to other transactions, which must not inherit
        their locks (a false conflict, not a missed one, but one for every client that
        has not seen the mark). Work in proportion to the locks of the dropped ones."""
        marks = self._marks
        if marks is None:  # no lock taken since it was last cleared: nothing to lower
            self._unsettled.clear()
            return
        for txid, lock_hashes in self._unsettled:
            if txid <= high_water_mark:
                continue  # the recovery kept it: committed
            for h in lock_hashes:
                for s in self._slots(h):
                    if marks[s] > high_water_mark:
                        marks[s] = high_water_mark
        self._unsettled.clear()

    def reset(self, high_water_mark: int) -> None:
        """After a recovery the history is unknown: every lock is as new as the log."""
        self.truncate(high_water_mark)
        if high_water_mark >= self._floor:
            self._floor = high_water_mark  # O(1): every entry now reads at least this
        else:  # the log went back (not in a running cluster): every entry is the mark
            self._marks = None
            self._floor = high_water_mark
