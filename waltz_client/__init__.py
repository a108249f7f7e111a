"""Waltz client: append transactions with optimistic locks, apply the committed feed.

Everything an application or a Spark job imports. The names load on first use (PEP 562):
the daemons import the shared layers below this package (``waltz_client.wire``, ...),
and importing those must not load the client, the DB-API callbacks and their
dependencies into every server and storage process."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Each public name and the module that defines it.
_EXPORTS = {
    "BlockingWaltzClient": ".blocking",
    "DatabaseCallbacks": ".dbapi",
    "Forbidden": ".errors",
    "Lock": ".transaction",
    "MissingTransactions": ".errors",
    "PartitionStats": ".client_stats",
    "SubmissionFailed": ".errors",
    "SubmitResult": ".submit_policy",
    "SubmitStatus": ".submit_policy",
    "Transaction": ".transaction",
    "TransactionBuilder": ".transaction",
    "TransactionContext": ".transaction",
    "WaltzClient": ".client",
    "WaltzClientCallbacks": ".callbacks",
    "WaltzClientConfig": ".config",
    "WaltzConfigError": ".config",
    "WaltzError": ".errors",
}

__all__ = [
    "BlockingWaltzClient",
    "DatabaseCallbacks",
    "Forbidden",
    "Lock",
    "MissingTransactions",
    "PartitionStats",
    "SubmissionFailed",
    "SubmitResult",
    "SubmitStatus",
    "Transaction",
    "TransactionBuilder",
    "TransactionContext",
    "WaltzClient",
    "WaltzClientCallbacks",
    "WaltzClientConfig",
    "WaltzConfigError",
    "WaltzError",
]  # the keys of _EXPORTS (tests/client/test_lazy_package.py)

if TYPE_CHECKING:
    from .blocking import BlockingWaltzClient
    from .callbacks import WaltzClientCallbacks
    from .client import WaltzClient
    from .client_stats import PartitionStats
    from .config import WaltzClientConfig, WaltzConfigError
    from .dbapi import DatabaseCallbacks
    from .errors import Forbidden, MissingTransactions, SubmissionFailed, WaltzError
    from .submit_policy import SubmitResult, SubmitStatus
    from .transaction import Lock, Transaction, TransactionBuilder, TransactionContext


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
