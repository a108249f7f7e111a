"""DatabaseCallbacks against real sqlite3 files: the high-water mark table, atomic
application, idempotence, ordering, per-thread connections, argument checks."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from waltz_client import DatabaseCallbacks, WaltzClientCallbacks
from waltz_client.dbapi import DatabaseSetupError, bind, table_ddl
from waltz_client.transaction import Transaction
from waltz_client.wire.records import ReqId

pytestmark = pytest.mark.timeout(60)


def txn(txid: int, partition: int = 0, data: bytes | None = None) -> Transaction:
    payload = data if data is not None else f"p{partition}-t{txid}".encode()

    async def fetch() -> bytes:
        return payload

    def fetch_blocking() -> bytes:
        return payload

    return Transaction(txid, partition, 0, ReqId(1, 1, partition, txid), fetch, fetch_blocking)


class Db:
    """A sqlite file with a ``rows`` table the user's apply writes to."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.connects: list[int] = []  # thread idents
        self._lock = threading.Lock()
        with sqlite3.connect(self.path) as conn:
            conn.execute("CREATE TABLE rows (partition_id INTEGER, txid INTEGER, data BLOB)")
        conn.close()

    def connect(self) -> sqlite3.Connection:
        with self._lock:
            self.connects.append(threading.get_ident())
        return sqlite3.connect(self.path, timeout=30)

    @staticmethod
    def apply(cursor, transaction: Transaction) -> None:
        cursor.execute(
            "INSERT INTO rows VALUES (?, ?, ?)",
            (transaction.partition_id, transaction.transaction_id, transaction.data_blocking()),
        )

    def callbacks(self, apply: Callable | None = None, **kwargs) -> DatabaseCallbacks:
        return DatabaseCallbacks(self.connect, apply or self.apply, **kwargs)

    def query(self, sql: str, *args) -> list[tuple]:
        conn = sqlite3.connect(self.path)
        try:
            return conn.execute(sql, args).fetchall()
        finally:
            conn.close()

    def rows(self) -> list[tuple[int, int]]:
        return self.query("SELECT partition_id, txid FROM rows ORDER BY partition_id, txid")

    def marks(self, table: str = "waltz_high_water_marks") -> dict[int, int]:
        return dict(self.query(f"SELECT partition_id, high_water_mark FROM {table}"))


@pytest.fixture
def db(tmp_path: Path) -> Db:
    return Db(tmp_path / "app.db")


def test_is_a_callbacks_implementation(db: Db) -> None:
    assert isinstance(db.callbacks(), WaltzClientCallbacks)


def test_fresh_database_mark_is_minus_one(db: Db) -> None:
    cb = db.callbacks()
    assert cb.client_high_water_mark(0) == -1
    assert cb.client_high_water_mark(17) == -1
    assert db.marks() == {}  # the table exists, empty


def test_marks_follow_applied_transactions_per_partition(db: Db) -> None:
    cb = db.callbacks()
    for t in range(3):
        cb.apply_transaction(txn(t, partition=0))
        assert cb.client_high_water_mark(0) == t
    cb.apply_transaction(txn(0, partition=5))
    assert cb.client_high_water_mark(0) == 2
    assert cb.client_high_water_mark(5) == 0
    assert cb.client_high_water_mark(1) == -1
    assert db.marks() == {0: 2, 5: 0}
    assert db.rows() == [(0, 0), (0, 1), (0, 2), (5, 0)]


def test_marks_survive_a_new_callbacks_object(db: Db) -> None:
    cb = db.callbacks()
    cb.apply_transaction(txn(0, 3))
    cb.apply_transaction(txn(1, 3))
    again = db.callbacks()
    assert again.client_high_water_mark(3) == 1
    again.apply_transaction(txn(2, 3))
    assert db.marks() == {3: 2}


def test_apply_gets_the_transaction_and_a_cursor(db: Db) -> None:
    seen = []

    def apply(cursor, transaction: Transaction) -> None:
        seen.append((transaction.transaction_id, transaction.data_blocking()))
        cursor.execute("SELECT 1")

    db.callbacks(apply).apply_transaction(txn(0, data=b"hello"))
    assert seen == [(0, b"hello")]


def test_failing_apply_stores_neither_row_nor_mark(db: Db) -> None:
    def apply(cursor, transaction: Transaction) -> None:
        Db.apply(cursor, transaction)
        raise ValueError("application bug")

    cb = db.callbacks(apply)
    with pytest.raises(ValueError, match="application bug"):
        cb.apply_transaction(txn(0))
    assert db.rows() == []
    assert db.marks() == {}
    assert cb.client_high_water_mark(0) == -1


def test_failing_apply_after_earlier_success_keeps_the_old_mark(db: Db) -> None:
    fail = [False]

    def apply(cursor, transaction: Transaction) -> None:
        Db.apply(cursor, transaction)
        if fail[0]:
            raise KeyboardInterrupt  # BaseException too

    cb = db.callbacks(apply)
    cb.apply_transaction(txn(0))
    cb.apply_transaction(txn(1))
    fail[0] = True
    with pytest.raises(KeyboardInterrupt):
        cb.apply_transaction(txn(2))
    assert db.rows() == [(0, 0), (0, 1)]
    assert db.marks() == {0: 1}
    # delivered again, it applies
    fail[0] = False
    cb.apply_transaction(txn(2))
    assert db.rows() == [(0, 0), (0, 1), (0, 2)]
    assert db.marks() == {0: 2}


def test_already_applied_is_a_no_op(db: Db) -> None:
    calls = []

    def apply(cursor, transaction: Transaction) -> None:
        calls.append(transaction.transaction_id)
        Db.apply(cursor, transaction)

    cb = db.callbacks(apply)
    for t in range(3):
        cb.apply_transaction(txn(t))
    for t in (2, 0, 1, 2):
        cb.apply_transaction(txn(t))
    assert calls == [0, 1, 2]
    assert db.rows() == [(0, 0), (0, 1), (0, 2)]
    assert cb.client_high_water_mark(0) == 2


def test_gap_raises_with_both_numbers(db: Db) -> None:
    calls = []
    cb = db.callbacks(lambda cur, t: calls.append(t))
    with pytest.raises(RuntimeError) as info:
        cb.apply_transaction(txn(5, partition=2))
    assert "5" in str(info.value) and "-1" in str(info.value)
    assert "partition 2" in str(info.value)
    assert calls == []


def test_gap_after_progress(db: Db) -> None:
    cb = db.callbacks()
    for t in range(4):
        cb.apply_transaction(txn(t))
    with pytest.raises(RuntimeError, match=r"transaction 10 .*high-water mark 3"):
        cb.apply_transaction(txn(10))
    assert db.marks() == {0: 3}
    assert db.rows() == [(0, t) for t in range(4)]
    cb.apply_transaction(txn(4))  # the connection is still usable
    assert db.marks() == {0: 4}


def test_each_thread_gets_its_own_connection(db: Db) -> None:
    cb = db.callbacks()
    n_threads = 4
    per_partition = 25
    barrier = threading.Barrier(n_threads)

    def worker(partition: int) -> int:
        barrier.wait()  # all threads alive at once: no thread reuse across partitions
        assert cb.client_high_water_mark(partition) == -1
        for t in range(per_partition):
            cb.apply_transaction(txn(t, partition))
        return threading.get_ident()

    with ThreadPoolExecutor(n_threads) as pool:
        idents = list(pool.map(worker, range(n_threads)))

    assert len(set(idents)) == n_threads
    # exactly one connect per thread, and every thread that worked connected once
    assert sorted(db.connects) == sorted(idents)
    assert db.marks() == {p: per_partition - 1 for p in range(n_threads)}
    for p in range(n_threads):
        assert cb.client_high_water_mark(p) == per_partition - 1
    assert len(db.rows()) == n_threads * per_partition


def test_connection_is_reused_within_a_thread(db: Db) -> None:
    cb = db.callbacks()
    c1 = cb.connection()
    cb.client_high_water_mark(0)
    cb.apply_transaction(txn(0))
    assert cb.connection() is c1
    assert len(db.connects) == 1
    other = []
    t = threading.Thread(target=lambda: other.append(cb.connection()))
    t.start()
    t.join()
    assert other[0] is not c1
    assert len(db.connects) == 2


def test_custom_table_name(db: Db) -> None:
    cb = db.callbacks(table="My_Marks_2")
    cb.apply_transaction(txn(0, 1))
    assert db.marks("My_Marks_2") == {1: 0}
    assert db.query("SELECT name FROM sqlite_master WHERE name = 'waltz_high_water_marks'") == []


def test_two_tables_are_independent(db: Db) -> None:
    a = db.callbacks(table="marks_a")
    b = db.callbacks(table="marks_b")
    a.apply_transaction(txn(0))
    a.apply_transaction(txn(1))
    assert b.client_high_water_mark(0) == -1


def test_big_transaction_ids(db: Db) -> None:
    cb = db.callbacks()
    conn = sqlite3.connect(db.path)
    cb.connection()  # creates the table
    big = 2**62
    conn.execute("INSERT INTO waltz_high_water_marks VALUES (0, ?)", (big,))
    conn.commit()
    conn.close()
    assert cb.client_high_water_mark(0) == big
    cb.apply_transaction(txn(big + 1))
    assert cb.client_high_water_mark(0) == big + 1


@pytest.mark.parametrize(
    "table",
    [
        "",
        "1abc",
        "a-b",
        "a b",
        "marks; DROP TABLE rows",
        "a.b",
        '"quoted"',
        "x" * 64,
        "émarks",
    ],
)
def test_bad_table_names(db: Db, table: str) -> None:
    with pytest.raises(ValueError, match="table"):
        db.callbacks(table=table)
    assert db.connects == []


@pytest.mark.parametrize("table", ["a", "_", "A_1", "x" * 63])
def test_good_table_names(db: Db, table: str) -> None:
    db.callbacks(table=table).apply_transaction(txn(0))
    assert db.marks(table) == {0: 0}


def test_table_name_with_trailing_newline_is_refused(db: Db) -> None:
    with pytest.raises(ValueError, match="table"):
        db.callbacks(table="marks\n")


@pytest.mark.parametrize("style", ["", "?", "%s", "Qmark", "sql"])
def test_bad_paramstyles(db: Db, style) -> None:
    with pytest.raises(ValueError, match="paramstyle"):
        db.callbacks(paramstyle=style)


@pytest.mark.parametrize(
    ("style", "sql", "params"),
    [
        ("qmark", "a = ? AND b = ?", (1, 2)),
        ("format", "a = %s AND b = %s", (1, 2)),
        ("numeric", "a = :1 AND b = :2", (1, 2)),
        ("named", "a = :p0 AND b = :p1", {"p0": 1, "p1": 2}),
        ("pyformat", "a = %(p0)s AND b = %(p1)s", {"p0": 1, "p1": 2}),
    ],
)
def test_every_dbapi_paramstyle_binds(style: str, sql: str, params) -> None:
    assert bind(style, "a = {} AND b = {}", (1, 2)) == (sql, params)


@pytest.mark.parametrize("style", ["qmark", "numeric", "named"])
def test_sqlite_accepts_its_paramstyles(db: Db, style: str) -> None:
    cb = db.callbacks(paramstyle=style)
    cb.apply_transaction(txn(0, 4))
    cb.apply_transaction(txn(1, 4))
    assert cb.client_high_water_mark(4) == 1


def test_paramstyle_defaults_to_the_drivers(db: Db) -> None:
    cb = db.callbacks()  # sqlite3.paramstyle == "qmark"
    cb.apply_transaction(txn(0))
    assert db.marks() == {0: 0}


def test_autocommit_connection_is_refused(db: Db) -> None:
    def connect() -> sqlite3.Connection:
        return sqlite3.connect(db.path, isolation_level=None)

    cb = DatabaseCallbacks(connect, Db.apply)
    with pytest.raises(DatabaseSetupError, match="autocommit"):
        cb.apply_transaction(txn(0))
    assert db.rows() == []


def test_two_clients_sharing_a_database_apply_once(db: Db) -> None:
    # Client A holds the partition's mark while its apply runs; client B, delivered the
    # same transaction meanwhile, waits on that lock instead of applying it too, then
    # finds the mark past it and does nothing.
    b_calls: list[int] = []
    a_applying = threading.Event()
    release_a = threading.Event()

    def apply_a(cursor, transaction: Transaction) -> None:
        a_applying.set()
        release_a.wait(30)
        Db.apply(cursor, transaction)

    def apply_b(cursor, transaction: Transaction) -> None:
        b_calls.append(transaction.transaction_id)
        Db.apply(cursor, transaction)

    a = db.callbacks(apply_a)
    b = db.callbacks(apply_b)
    with ThreadPoolExecutor(2) as pool:
        done_a = pool.submit(a.apply_transaction, txn(0))
        assert a_applying.wait(30)
        done_b = pool.submit(b.apply_transaction, txn(0))
        time.sleep(0.2)  # B reaches the lock (a wait, not a failure: A still holds it)
        assert not done_b.done()
        release_a.set()
        done_a.result(30)
        done_b.result(30)
    assert db.marks() == {0: 0}
    assert db.rows() == [(0, 0)]
    assert b_calls == []
    assert (a.stats.applied, b.stats.already_applied, b.stats.rolled_back) == (1, 1, 0)


def test_failed_statement_is_rolled_back_before_the_connection_is_reused(db: Db) -> None:
    def apply(cursor, transaction: Transaction) -> None:
        cursor.execute("INSERT INTO no_such_table VALUES (1)")

    cb = db.callbacks(apply)
    with pytest.raises(sqlite3.OperationalError, match="no_such_table"):
        cb.apply_transaction(txn(0))
    assert cb.stats.rolled_back == 1
    assert cb.client_high_water_mark(0) == -1
    assert db.marks() == {}


def test_busy_database_is_retried(db: Db) -> None:
    def connect() -> sqlite3.Connection:
        return sqlite3.connect(db.path, timeout=0.05)

    cb = DatabaseCallbacks(connect, Db.apply)
    cb.connection()
    holder = sqlite3.connect(db.path, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")  # another writer holds the database for a while
    threading.Timer(0.3, holder.rollback).start()
    cb.apply_transaction(txn(0))
    holder.close()
    assert cb.stats.retried >= 1
    assert db.marks() == {0: 0}


def test_close_closes_every_threads_connection(db: Db) -> None:
    def connect() -> sqlite3.Connection:  # sqlite: closable from another thread
        return sqlite3.connect(db.path, check_same_thread=False)

    cb = DatabaseCallbacks(connect, Db.apply)
    mine = cb.connection()
    other: list[sqlite3.Connection] = []
    t = threading.Thread(target=lambda: other.append(cb.connection()))
    t.start()
    t.join()
    cb.close()
    for conn in (mine, other[0]):
        with pytest.raises(sqlite3.ProgrammingError, match="closed"):
            conn.execute("SELECT 1")
    cb.apply_transaction(txn(0))  # a new connection after close()
    assert cb.connection() is not mine
    assert db.marks() == {0: 0}


def test_table_must_exist_when_not_created(db: Db) -> None:
    cb = db.callbacks(create_table=False)
    with pytest.raises(DatabaseSetupError, match=r"CREATE TABLE IF NOT EXISTS waltz_high_water"):
        cb.client_high_water_mark(0)
    conn = sqlite3.connect(db.path)
    conn.execute(table_ddl())
    conn.close()
    assert cb.client_high_water_mark(0) == -1
