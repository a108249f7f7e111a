"""Exactly-once application into a DB-API database (sqlite3, PostgreSQL, ...).

The counterpart of the original's JDBC callbacks: the partition's high-water
mark lives in a table of the application's own database, and each committed
transaction is applied inside the same database transaction that advances
it. A crash at any moment leaves the two in step: the mount after a restart
starts from the stored mark, so nothing is applied twice and nothing skipped.

Several clients may share one database: each application first locks its
partition's mark row, so appliers of one partition take turns before touching
any application row, and a client that finds the mark already past its
transaction does nothing. Callbacks run on the client's worker threads; each
thread has its own connection (``connect`` is called once per thread).
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .callbacks import WaltzClientCallbacks
from .transaction import Transaction

log = logging.getLogger(__name__)

PARAMSTYLES = ("qmark", "numeric", "named", "format", "pyformat")
_TABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
# SQLSTATEs a database raises when retrying the same transaction can succeed.
_TRANSIENT_SQLSTATES = {"40001", "40P01"}  # serialization failure, deadlock detected


class DatabaseSetupError(RuntimeError):
    """The connection or the high-water mark table cannot be used as they are."""


def table_ddl(table: str = "waltz_high_water_marks") -> str:
    """The statement that creates the high-water mark table, for applications whose
    database role may not create tables (run it once as the schema's owner, and grant the
    role SELECT, INSERT and UPDATE on it)."""
    if not _TABLE_NAME.fullmatch(table):
        raise ValueError(f"table must be a plain SQL identifier, got {table!r}")
    return (
        f"CREATE TABLE IF NOT EXISTS {table} "
        f"(partition_id INTEGER PRIMARY KEY, high_water_mark BIGINT NOT NULL)"
    )


def bind(paramstyle: str, sql: str, values: tuple) -> tuple[str, Any]:
    """``sql`` with each ``{}`` replaced by the driver's parameter marker, and the
    parameters in the shape that paramstyle wants (a tuple, or a dict for named ones)."""
    names = [f"p{i}" for i in range(len(values))]
    if paramstyle == "qmark":
        return sql.format(*["?"] * len(values)), values
    if paramstyle == "format":
        return sql.format(*["%s"] * len(values)), values
    if paramstyle == "numeric":
        return sql.format(*[f":{i + 1}" for i in range(len(values))]), values
    if paramstyle == "named":
        return sql.format(*[f":{n}" for n in names]), dict(zip(names, values, strict=True))
    if paramstyle == "pyformat":
        return sql.format(*[f"%({n})s" for n in names]), dict(zip(names, values, strict=True))
    raise ValueError(f"paramstyle must be one of {', '.join(PARAMSTYLES)}, got {paramstyle!r}")


def driver_module(conn: Any) -> Any:
    """The DB-API module a connection object comes from (``sqlite3``, ``psycopg``, ...)."""
    return sys.modules.get(type(conn).__module__.split(".")[0])


def in_autocommit(conn: Any) -> bool:
    """Whether every statement on ``conn`` commits on its own, so a rollback undoes
    nothing (psycopg, psycopg2, sqlite3 of 3.12 and later: ``autocommit``; older sqlite3:
    ``isolation_level is None``; MySQL drivers: ``get_autocommit()``)."""
    flag = getattr(conn, "autocommit", None)
    if callable(flag):  # pymysql's autocommit(value) is a setter
        flag = None
    if flag is True:
        return True
    getter = getattr(conn, "get_autocommit", None)
    if callable(getter):
        return bool(getter())
    if driver_module(conn) is sys.modules.get("sqlite3") and flag in (None, -1):
        return getattr(conn, "isolation_level", "") is None
    return False


def is_transient(error: BaseException) -> bool:
    """A failure that running the same transaction again may not meet: a serialization
    failure or deadlock (PostgreSQL and others), or a busy sqlite database."""
    code = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
    if code in _TRANSIENT_SQLSTATES:
        return True
    return type(error).__name__ == "OperationalError" and "database is locked" in str(error)


@dataclass
class ApplyStats:
    """What this object's applications came to (totals since it was created)."""

    applied: int = 0  # committed: the transaction's effects and the mark advanced
    already_applied: int = 0  # found the mark at or past it (another client sharing the db)
    rolled_back: int = 0  # apply() ran, then the database transaction was rolled back
    retried: int = 0  # transient failures (serialization, deadlock, busy) run again


class DatabaseCallbacks(WaltzClientCallbacks):
    def __init__(
        self,
        connect: Callable[[], Any],
        apply: Callable[[Any, Transaction], None],
        *,
        table: str = "waltz_high_water_marks",
        paramstyle: str | None = None,
        create_table: bool = True,
        transient_retries: int = 5,
    ) -> None:
        """``connect()`` opens a DB-API connection, not in autocommit mode;
        ``apply(cursor, transaction)`` writes one transaction's effects with that cursor
        (no commit: this class commits). ``paramstyle`` is how this class writes its own
        statements' parameters; by default the driver's DB-API ``paramstyle``. With
        ``create_table=False`` the mark table must exist already (see ``table_ddl``).
        A serialization failure or deadlock is run again up to ``transient_retries``
        times before apply_transaction raises it."""
        self._ddl = table_ddl(table)
        if paramstyle is not None and paramstyle not in PARAMSTYLES:
            raise ValueError(
                f"paramstyle must be one of {', '.join(PARAMSTYLES)} (or None: the "
                f"driver's), got {paramstyle!r}"
            )
        if transient_retries < 0:
            raise ValueError(f"transient_retries must be >= 0, got {transient_retries}")
        self._connect = connect
        self._apply = apply
        self._table = table
        self._paramstyle = paramstyle
        self._create_table = create_table
        self._transient_retries = transient_retries
        self._local = threading.local()
        self._lock = threading.RLock()  # _ensure_table may _discard while holding it
        self._open: list[Any] = []  # every connection this object opened, for close()
        self._epoch = 0  # bumped by close(): threads open a new connection afterwards
        self._table_ready = False
        self.stats = ApplyStats()

    # --- connections --------------------------------------------------------------------

    def connection(self) -> Any:
        """This thread's connection, opened, checked and the mark table created on first
        use. Call it once at start-up to fail fast on a bad connection or table."""
        conn = getattr(self._local, "conn", None)
        if conn is not None and self._local.epoch == self._epoch:
            return conn
        conn = self._connect()
        try:
            if in_autocommit(conn):
                raise DatabaseSetupError(
                    f"the connection from connect() is in autocommit mode: a failed apply "
                    f"could not be rolled back and would be applied again; open it with "
                    f"autocommit off ({type(conn).__module__}.{type(conn).__name__})"
                )
            style = self._paramstyle or getattr(driver_module(conn), "paramstyle", None)
            if style not in PARAMSTYLES:
                raise DatabaseSetupError(
                    f"cannot tell the paramstyle of {type(conn).__module__} connections "
                    f"(found {style!r}); pass paramstyle= to DatabaseCallbacks"
                )
            self._style = style
            self._sqlite = driver_module(conn) is sys.modules.get("sqlite3")
            with self._lock:
                if not self._table_ready:
                    self._ensure_table(conn)
                    self._table_ready = True
        except BaseException:
            _quietly(conn.close)
            raise
        with self._lock:
            self._open.append(conn)
            self._local.conn, self._local.epoch = conn, self._epoch
        return conn

    def close(self) -> None:
        """Close every connection this object opened, on any thread (as far as the driver
        allows: sqlite3 needs ``check_same_thread=False``). A later call opens new ones."""
        with self._lock:
            connections, self._open = self._open, []
            self._epoch += 1
        for conn in connections:
            try:
                conn.close()
            except Exception as e:  # e.g. sqlite3 opened with check_same_thread=True
                log.warning("could not close a connection: %s", e)

    def _discard(self, conn: Any) -> None:
        """Drop a connection that failed to roll back: the next call opens a new one."""
        with self._lock:
            if conn in self._open:
                self._open.remove(conn)
        if getattr(self._local, "conn", None) is conn:
            self._local.conn = None
        _quietly(conn.close)

    def _rollback(self, conn: Any) -> None:
        try:
            conn.rollback()
        except Exception:
            log.warning("rollback failed; reconnecting", exc_info=True)
            self._discard(conn)

    def _execute(self, cursor: Any, sql: str, *values: Any) -> None:
        cursor.execute(*bind(self._style, sql, values))

    def _ensure_table(self, conn: Any) -> None:
        """Make sure the mark table exists: it may already (another process created it,
        or the application did with ``table_ddl``); creating it may race with another
        process or be refused to a least-privileged role."""
        unreadable = self._table_unreadable(conn)
        if unreadable is None:
            return
        if not self._create_table:
            raise DatabaseSetupError(
                f"the high-water mark table {self._table} cannot be read ({unreadable}); "
                f"create it with: {self._ddl}"
            )
        try:
            conn.cursor().execute(self._ddl)
            conn.commit()
        except Exception as e:
            self._rollback(conn)
            if self._table_unreadable(conn) is None:
                return  # another process created it meanwhile
            raise DatabaseSetupError(
                f"the high-water mark table {self._table} cannot be read ({unreadable}) "
                f"nor created ({type(e).__name__}: {e}); as a role that may, run: "
                f"{self._ddl}; then grant SELECT, INSERT, UPDATE on it"
            ) from e

    def _table_unreadable(self, conn: Any) -> str | None:
        """None if the mark table can be read, else the database's reason."""
        try:
            cursor = conn.cursor()
            cursor.execute(f"SELECT partition_id, high_water_mark FROM {self._table} WHERE 1 = 0")
            cursor.fetchall()
            return None
        except Exception as e:
            return f"{type(e).__name__}: {str(e).strip()}"
        finally:
            self._rollback(conn)

    # --- the callbacks ------------------------------------------------------------------

    def _stored(self, cursor: Any, partition_id: int, lock: bool = False) -> int | None:
        if lock and self._sqlite:
            # sqlite has no row locks: the first write of a transaction takes the
            # database's write lock, which serialises appliers just as well.
            self._execute(
                cursor,
                f"UPDATE {self._table} SET high_water_mark = high_water_mark "
                f"WHERE partition_id = {{}}",
                partition_id,
            )
        suffix = " FOR UPDATE" if lock and not self._sqlite else ""
        self._execute(
            cursor,
            f"SELECT high_water_mark FROM {self._table} WHERE partition_id = {{}}{suffix}",
            partition_id,
        )
        row = cursor.fetchone()
        return None if row is None else int(row[0])

    def client_high_water_mark(self, partition_id: int) -> int:
        conn = self.connection()
        try:
            stored = self._stored(conn.cursor(), partition_id)
        finally:
            self._rollback(conn)  # end the read transaction; nothing was written
        return -1 if stored is None else stored

    def apply_transaction(self, transaction: Transaction) -> None:
        attempt = 0
        while True:
            try:
                self._apply_once(transaction)
                return
            except Exception as e:
                if attempt >= self._transient_retries or not is_transient(e):
                    raise
                attempt += 1
                self.stats.retried += 1
                log.info(
                    "partition %d transaction %d: %s; running it again (%d of %d)",
                    transaction.partition_id,
                    transaction.transaction_id,
                    type(e).__name__,
                    attempt,
                    self._transient_retries,
                )
                time.sleep(min(0.5, 0.01 * 2**attempt))

    def _apply_once(self, transaction: Transaction) -> None:
        conn = self.connection()
        cursor = conn.cursor()
        p, txid = transaction.partition_id, transaction.transaction_id
        applying = False
        try:
            # Lock the mark row first: another applier of this partition waits here, not
            # on the application's rows (where two would deadlock or one redo work).
            stored = self._stored(cursor, p, lock=True)
            if stored is None:
                # The partition's first transaction here: the new key is the lock (a
                # concurrent first insert waits, then fails on the primary key).
                self._execute(
                    cursor,
                    f"INSERT INTO {self._table} (partition_id, high_water_mark) "
                    f"VALUES ({{}}, {{}})",
                    p,
                    -1,
                )
                stored = -1
            if txid <= stored:
                self._rollback(conn)  # applied before (by another client sharing this db)
                self.stats.already_applied += 1
                return
            if txid != stored + 1:
                raise RuntimeError(
                    f"partition {p}: transaction {txid} does not follow the stored "
                    f"high-water mark {stored}"
                )
            applying = True
            self._apply(cursor, transaction)
            self._execute(
                cursor,
                f"UPDATE {self._table} SET high_water_mark = {{}} "
                f"WHERE partition_id = {{}} AND high_water_mark = {{}}",
                txid,
                p,
                stored,
            )
            if cursor.rowcount != 1:  # only without a row lock (a driver that ignores it)
                self._rollback(conn)
                self.stats.rolled_back += 1
                return
            conn.commit()
            self.stats.applied += 1
        except BaseException:
            self._rollback(conn)
            if applying:
                self.stats.rolled_back += 1
            if self._applied_elsewhere(p, txid):
                self.stats.already_applied += 1
                return
            raise

    def _applied_elsewhere(self, partition_id: int, txid: int) -> bool:
        """After a failure: did another client sharing the database apply ``txid``?"""
        try:
            return self.client_high_water_mark(partition_id) >= txid
        except Exception:
            return False


def _quietly(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception:
        log.debug("ignored while closing", exc_info=True)
