"""WaltzClientCallbacks: how the client learns an application's high-water mark and hands
it committed transactions. Methods may be plain or ``async``: plain ones run on a worker
thread (they may block, and fetch data with ``transaction.data_blocking()``), async ones
on the client's event loop."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod

from .transaction import Transaction

log = logging.getLogger(__name__)


class WaltzClientCallbacks(ABC):
    @abstractmethod
    def client_high_water_mark(self, partition_id: int) -> int:
        """The highest transaction ID of this partition the application has applied (-1:
        none). Read at mount and before every execution of a transaction context."""

    @abstractmethod
    def apply_transaction(self, transaction: Transaction) -> None:
        """Apply one committed transaction; called in commit order, each exactly once per
        mount. Raising makes the client deliver it again (after uncaught_exception)."""

    def uncaught_exception(self, partition_id: int, transaction_id: int, error: BaseException):
        log.error(
            "applying transaction %d of partition %d failed: %r; it will be delivered again",
            transaction_id,
            partition_id,
            error,
        )

    def partitions_added(self, partition_ids: list[int]) -> None:
        """The cluster grew: ``partition_ids`` are new. A client that follows every
        partition (``WaltzClientConfig.partitions`` None) has begun mounting them (from
        ``client_high_water_mark``, as any partition), and its ``num_partitions`` is the
        new count."""
        log.info("the cluster grew: partitions %s are new", partition_ids)
