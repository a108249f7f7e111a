"""Exactly-once application into a DB-API database (sqlite3, PostgreSQL, ...).

The counterpart of the original's JDBC callbacks: the partition's high-water
mark lives in a table of the application's own database, and each committed
transaction is applied inside the same database transaction that advances
it. A crash at any moment leaves the two in step: the mount after a restart
starts from the stored mark, so nothing is applied twice and nothing skipped.
Callbacks run on the client's worker threads; each thread has its own
connection (``connect`` is called once per thread).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

from .callbacks import WaltzClientCallbacks
from .transaction import Transaction

_MARKERS = {"qmark": "?", "format": "%s"}  # DB-API paramstyle -> parameter marker
_TABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


class DatabaseCallbacks(WaltzClientCallbacks):
    def __init__(
        self,
        connect: Callable[[], Any],
        apply: Callable[[Any, Transaction], None],
        *,
        table: str = "waltz_high_water_marks",
        paramstyle: str = "qmark",
    ) -> None:
        """``connect()`` opens a DB-API connection; ``apply(cursor, transaction)`` writes
        one transaction's effects with that cursor (no commit: this class commits).
        ``paramstyle`` is the driver's DB-API paramstyle: ``qmark`` (``?``) for sqlite3,
        ``format`` (``%s``) for psycopg."""
        if not _TABLE_NAME.fullmatch(table):
            raise ValueError(f"table must be a plain SQL identifier, got {table!r}")
        if paramstyle not in _MARKERS:
            raise ValueError(f"paramstyle must be 'qmark' or 'format', got {paramstyle!r}")
        self._connect = connect
        self._apply = apply
        self._table = table
        self._p = _MARKERS[paramstyle]
        self._local = threading.local()
        self._create_lock = threading.Lock()
        self._created = False

    def connection(self) -> Any:
        """This thread's connection (opened on first use)."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._connect()
            with self._create_lock:
                if not self._created:
                    cur = conn.cursor()
                    cur.execute(
                        f"CREATE TABLE IF NOT EXISTS {self._table} "
                        f"(partition_id INTEGER PRIMARY KEY, high_water_mark BIGINT NOT NULL)"
                    )
                    conn.commit()
                    self._created = True
        return conn

    def _stored(self, cursor: Any, partition_id: int) -> int:
        cursor.execute(
            f"SELECT high_water_mark FROM {self._table} WHERE partition_id = {self._p}",
            (partition_id,),
        )
        row = cursor.fetchone()
        return -1 if row is None else int(row[0])

    def client_high_water_mark(self, partition_id: int) -> int:
        conn = self.connection()
        cursor = conn.cursor()
        try:
            return self._stored(cursor, partition_id)
        finally:
            conn.rollback()  # end the read transaction; nothing was written

    def apply_transaction(self, transaction: Transaction) -> None:
        conn = self.connection()
        cursor = conn.cursor()
        p, txid = transaction.partition_id, transaction.transaction_id
        try:
            stored = self._stored(cursor, p)
            if txid <= stored:
                conn.rollback()  # applied before (by another client sharing this database)
                return
            if txid != stored + 1:
                raise RuntimeError(
                    f"partition {p}: transaction {txid} does not follow the stored "
                    f"high-water mark {stored}"
                )
            self._apply(cursor, transaction)
            if not self._advance(cursor, p, stored, txid):
                # Another client sharing this database applied it meanwhile: keep theirs.
                conn.rollback()
                return
            conn.commit()
        except BaseException:
            conn.rollback()
            if self._applied_elsewhere(p, txid):
                return
            raise

    def _advance(self, cursor: Any, partition_id: int, stored: int, txid: int) -> bool:
        """Move the mark from ``stored`` to ``txid``, only if it is still ``stored``."""
        if stored >= 0:
            cursor.execute(
                f"UPDATE {self._table} SET high_water_mark = {self._p} "
                f"WHERE partition_id = {self._p} AND high_water_mark = {self._p}",
                (txid, partition_id, stored),
            )
            return cursor.rowcount == 1
        # No row yet: a concurrent first insert fails on the primary key.
        cursor.execute(
            f"INSERT INTO {self._table} (partition_id, high_water_mark) "
            f"VALUES ({self._p}, {self._p})",
            (partition_id, txid),
        )
        return True

    def _applied_elsewhere(self, partition_id: int, txid: int) -> bool:
        """After a failure: did another client sharing the database apply ``txid``?"""
        try:
            return self.client_high_water_mark(partition_id) >= txid
        except Exception:
            return False
