"""A bank on Waltz: accounts in each client's own database, transfers as transactions
with write locks on both accounts, applied exactly once.

Every client's database starts with the same balances; the log holds the
transfers. A transfer is computed against the client's database at its
high-water mark and locks both accounts, so the server rejects it if either
account changed since: balances never go negative, however many clients
transfer concurrently, and every client's database converges to the same
state. Accounts live in partition ``account % partitions``; a transfer
stays within one partition (a lock's scope).

A client's database is a sqlite file (the embedded default) or a schema of a
PostgreSQL database (``BankDb("postgresql://...", schema=...)``, through psycopg);
several clients may share one.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from typing import Any

from waltz_client.dbapi import DatabaseCallbacks
from waltz_client.transaction import Lock, Transaction, TransactionBuilder, TransactionContext

SCHEMA = """
CREATE TABLE IF NOT EXISTS accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS applied (
    partition_id INTEGER NOT NULL,
    transaction_id BIGINT NOT NULL,
    PRIMARY KEY (partition_id, transaction_id)
);
"""


def is_postgres_url(location: str) -> bool:
    return location.startswith(("postgresql://", "postgres://"))


class BankDb:
    """Where one bank client keeps its accounts: a sqlite file, or a schema (created if
    missing) of a PostgreSQL database given by URL."""

    def __init__(self, location: str, schema: str = "bank") -> None:
        self.location = location
        self.schema = schema
        self.postgres = is_postgres_url(location)
        self.marker = "%s" if self.postgres else "?"
        self._reader = threading.local()  # an autocommit connection for balance reads
        self._readers: list[Any] = []

    def __repr__(self) -> str:
        where = f"{self.location} schema {self.schema}" if self.postgres else self.location
        return f"BankDb({where})"

    def connect(self, autocommit: bool = False) -> Any:
        """A new DB-API connection to this bank's tables."""
        if self.postgres:
            import psycopg  # the postgres extra; only a PostgreSQL bank needs it

            return psycopg.connect(
                self.location, autocommit=autocommit, options=f"-c search_path={self.schema}"
            )
        conn = sqlite3.connect(
            self.location,
            timeout=60,
            check_same_thread=False,
            isolation_level=None if autocommit else "",
        )
        conn.execute("PRAGMA journal_mode=WAL")
        return conn

    def _query(self, sql: str, *args: Any) -> list[tuple]:
        conn = self.connect(autocommit=True)
        try:
            cur = conn.cursor()
            cur.execute(sql.replace("?", self.marker), args)
            return [tuple(row) for row in cur.fetchall()]
        finally:
            conn.close()

    def create(self, accounts: int, initial_balance: int, fresh: bool = False) -> None:
        """The tables, with every account at its initial balance (once); ``fresh`` first
        drops a PostgreSQL schema left by an earlier run."""
        if self.postgres:
            conn = self.connect(autocommit=True)
            try:
                if fresh:
                    conn.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
                conn.execute(f"CREATE SCHEMA IF NOT EXISTS {self.schema}")
                for statement in filter(str.strip, SCHEMA.split(";")):
                    conn.execute(statement)
                conn.cursor().executemany(
                    "INSERT INTO accounts (id, balance) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                    [(a, initial_balance) for a in range(accounts)],
                )
            finally:
                conn.close()
            return
        conn = self.connect()
        try:
            conn.executescript(SCHEMA)
            conn.executemany(
                "INSERT OR IGNORE INTO accounts (id, balance) VALUES (?, ?)",
                [(a, initial_balance) for a in range(accounts)],
            )
            conn.commit()
        finally:
            conn.close()

    def balances(self) -> dict[int, int]:
        return dict(self._query("SELECT id, balance FROM accounts ORDER BY id"))

    def applied(self) -> list[tuple[int, int]]:
        return self._query("SELECT partition_id, transaction_id FROM applied ORDER BY 1, 2")

    def balance(self, account: int) -> int:
        """One account's balance, on a connection kept for this thread."""
        conn = getattr(self._reader, "conn", None)
        if conn is None:
            conn = self._reader.conn = self.connect(autocommit=True)
            self._readers.append(conn)
        cur = conn.cursor()
        cur.execute(f"SELECT balance FROM accounts WHERE id = {self.marker}", (account,))
        (balance,) = cur.fetchone()
        return int(balance)

    def close(self) -> None:
        """Close the connections ``balance`` kept."""
        readers, self._readers = self._readers, []
        for conn in readers:
            conn.close()
        self._reader = threading.local()

    def apply_transfer(self, cursor: Any, transaction: Transaction) -> None:
        t = json.loads(transaction.data_blocking())
        m = self.marker
        # Both accounts in id order: appliers of different transactions never wait on
        # each other's rows in opposite orders.
        for account, delta in sorted([(t["from"], -t["amount"]), (t["to"], t["amount"])]):
            cursor.execute(
                f"UPDATE accounts SET balance = balance + {m} WHERE id = {m}", (delta, account)
            )
        # The primary key makes a second application of the same transaction fail loudly.
        cursor.execute(
            f"INSERT INTO applied (partition_id, transaction_id) VALUES ({m}, {m})",
            (transaction.partition_id, transaction.transaction_id),
        )

    def callbacks(self) -> DatabaseCallbacks:
        return DatabaseCallbacks(self.connect, self.apply_transfer)


def bank_db(where: str | BankDb) -> BankDb:
    return where if isinstance(where, BankDb) else BankDb(where)


def connect(path: str) -> sqlite3.Connection:
    return BankDb(path).connect()


def open_bank(where: str | BankDb, accounts: int, initial_balance: int) -> None:
    """Create the database with every account at its initial balance (once)."""
    bank_db(where).create(accounts, initial_balance)


def balances(where: str | BankDb) -> dict[int, int]:
    return bank_db(where).balances()


def applied(where: str | BankDb) -> list[tuple[int, int]]:
    return bank_db(where).applied()


def apply_transfer(cursor: Any, transaction: Transaction) -> None:
    """Apply a transfer to a sqlite bank (``?`` parameters)."""
    BankDb("").apply_transfer(cursor, transaction)


def bank_callbacks(where: str | BankDb) -> DatabaseCallbacks:
    return bank_db(where).callbacks()


@dataclass
class Transfer(TransactionContext):
    """Move ``amount`` from one account to another of the same partition, if it is there."""

    path: str | BankDb
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
        db = self.path
        if isinstance(db, BankDb):
            balance = db.balance(self.source)
        else:  # a sqlite path: a short connection (tests share files across processes)
            conn = connect(db)
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
