"""Waltz client: append transactions with optimistic locks, apply the committed feed.

Everything an application or a Spark job imports."""

__version__ = "0.1.0"

from .blocking import BlockingWaltzClient
from .callbacks import WaltzClientCallbacks
from .client import (
    Forbidden,
    MissingTransactions,
    SubmitResult,
    SubmitStatus,
    WaltzClient,
    WaltzError,
)
from .config import WaltzClientConfig, WaltzConfigError
from .dbapi import DatabaseCallbacks
from .transaction import Lock, Transaction, TransactionBuilder, TransactionContext

__all__ = [
    "BlockingWaltzClient",
    "DatabaseCallbacks",
    "Forbidden",
    "Lock",
    "MissingTransactions",
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
]
