"""The transaction monitor: what became of each append, read from the committed feed.

The spec's "Detection of Failed Append Requests". Per partition, the appends
this client sent and has not yet seen resolved, in send order. The server
handles one partition's appends in order, so when one of them shows up in
the feed, every earlier one is settled: it committed earlier (and was seen),
was rejected (its lock failure arrived first, on the same connection), or
was dropped (a stale generation, a lost store session). A Mount answer
settles everything sent before it the same way. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import Generic, TypeVar

from .wire.records import ReqId

T = TypeVar("T")


class Outcome(Enum):
    COMMITTED = "committed"
    LOCK_FAILED = "lock failed"
    LOST = "lost"  # never committed: dropped by the server, or in flight across a reconnect
    REFUSED = "refused"  # never committed: the server refused it (the access policy)


@dataclass(frozen=True)
class Resolution(Generic[T]):
    item: T
    outcome: Outcome
    transaction_id: int = -1  # the committed ID, or the one that made the lock fail
    reason: str = ""  # why it was refused
    # LOST, settled by the answer of a mount that succeeded: the partition is mounted
    # again (at its owner, a new one after a move), so a retry need not wait.
    remounted: bool = False


class TransactionMonitor(Generic[T]):
    """Pending appends of one partition, keyed by ReqId, each with a caller's item."""

    def __init__(self) -> None:
        self._pending: OrderedDict[ReqId, T] = OrderedDict()

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, req_id: ReqId) -> bool:
        return req_id in self._pending

    def items(self) -> Iterator[T]:
        return iter(self._pending.values())

    def sent(self, req_id: ReqId, item: T) -> None:
        if req_id in self._pending:
            raise ValueError(f"{req_id} is already pending")
        self._pending[req_id] = item

    def committed(self, req_id: ReqId, transaction_id: int) -> list[Resolution[T]]:
        """``req_id`` appeared in the feed as ``transaction_id``: it and everything sent
        before it are resolved. Another client's ReqId resolves nothing."""
        if req_id not in self._pending:
            return []
        out: list[Resolution[T]] = []
        while self._pending:
            q, item = self._pending.popitem(last=False)
            if q == req_id:
                out.append(Resolution(item, Outcome.COMMITTED, transaction_id))
                return out
            out.append(Resolution(item, Outcome.LOST))
        raise AssertionError("unreachable: req_id was pending")

    def lock_failed(self, req_id: ReqId, transaction_id: int) -> Resolution[T] | None:
        item = self._pending.pop(req_id, None)
        if item is None:
            return None
        return Resolution(item, Outcome.LOCK_FAILED, transaction_id)

    def refused(self, req_id: ReqId, reason: str) -> Resolution[T] | None:
        """The server refused the append outright: it never reached the partition."""
        item = self._pending.pop(req_id, None)
        if item is None:
            return None
        return Resolution(item, Outcome.REFUSED, reason=reason)

    def flushed(self, sent_before: set[ReqId]) -> list[Resolution[T]]:
        """A Flush answer: appends sent before the flush and still pending never commit."""
        lost = [q for q in self._pending if q in sent_before]
        return [Resolution(self._pending.pop(q), Outcome.LOST) for q in lost]

    def pending_ids(self) -> set[ReqId]:
        return set(self._pending)

    def mounted(self) -> list[Resolution[T]]:
        """A successful Mount's answer: nothing sent before it can still commit."""
        out = [Resolution(item, Outcome.LOST, remounted=True) for item in self._pending.values()]
        self._pending.clear()
        return out
