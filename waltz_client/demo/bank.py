"""A bank on Waltz: accounts in each client's own sqlite database, transfers as
transactions with write locks on both accounts, applied exactly once.

Every client's database starts with the same balances; the log holds the
transfers. A transfer is computed against the client's database at its
high-water mark and locks both accounts, so the server rejects it if either
account changed since: balances never go negative, however many clients
transfer concurrently, and every client's database converges to the same
state. Accounts live in partition ``account % partitions``; a transfer
stays within one partition (a lock's scope).
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass

from ..dbapi import DatabaseCallbacks
from ..transaction import Lock, Transaction, TransactionBuilder, TransactionContext

SCHEMA = """
CREATE TABLE IF NOT EXISTS accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS applied (
    partition_id INTEGER NOT NULL,
    transaction_id INTEGER NOT NULL,
    PRIMARY KEY (partition_id, transaction_id)
);
"""


def connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=60, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    return conn


def open_bank(path: str, accounts: int, initial_balance: int) -> None:
    """Create the database with every account at its initial balance (once)."""
    conn = connect(path)
    try:
        conn.executescript(SCHEMA)
        conn.executemany(
            "INSERT OR IGNORE INTO accounts (id, balance) VALUES (?, ?)",
            [(a, initial_balance) for a in range(accounts)],
        )
        conn.commit()
    finally:
        conn.close()


def balances(path: str) -> dict[int, int]:
    conn = connect(path)
    try:
        return dict(conn.execute("SELECT id, balance FROM accounts ORDER BY id").fetchall())
    finally:
        conn.close()


def applied(path: str) -> list[tuple[int, int]]:
    conn = connect(path)
    try:
        return conn.execute(
            "SELECT partition_id, transaction_id FROM applied ORDER BY 1, 2"
        ).fetchall()
    finally:
        conn.close()


def apply_transfer(cursor: sqlite3.Cursor, transaction: Transaction) -> None:
    t = json.loads(transaction.data_blocking())
    cursor.execute(
        "UPDATE accounts SET balance = balance - ? WHERE id = ?", (t["amount"], t["from"])
    )
    cursor.execute("UPDATE accounts SET balance = balance + ? WHERE id = ?", (t["amount"], t["to"]))
    # The primary key makes a second application of the same transaction fail loudly.
    cursor.execute(
        "INSERT INTO applied (partition_id, transaction_id) VALUES (?, ?)",
        (transaction.partition_id, transaction.transaction_id),
    )


def bank_callbacks(path: str) -> DatabaseCallbacks:
    return DatabaseCallbacks(lambda: connect(path), apply_transfer)


@dataclass
class Transfer(TransactionContext):
    """Move ``amount`` from one account to another of the same partition, if it is there."""

    path: str
    source: int
    target: int
    amount: int
    partitions: int
    insufficient: bool = False

    def __post_init__(self) -> None:
        if self.source % self.partitions != self.target % self.partitions:
            raise ValueError("a transfer stays within one partition")

    def partition_id(self, num_partitions: int) -> int:
        return self.source % num_partitions

    def execute(self, builder: TransactionBuilder) -> bool:
        conn = connect(self.path)
        try:
            (balance,) = conn.execute(
                "SELECT balance FROM accounts WHERE id = ?", (self.source,)
            ).fetchone()
        finally:
            conn.close()
        if balance < self.amount:
            self.insufficient = True
            return False
        transfer = {"from": self.source, "to": self.target, "amount": self.amount}
        transfer["at"] = round(time.time(), 3)  # for reports over time (the Spark example)
        builder.set_data(json.dumps(transfer).encode())
        builder.set_write_locks(Lock("account", self.source), Lock("account", self.target))
        return True
