"""DatabaseCallbacks against a real PostgreSQL server, with psycopg 3: the driver's own
paramstyle, autocommit refused, the mark table created safely by racing processes and
used by a role that may not create it, a failure rolled back before the connection is
reused, and clients sharing one database taking turns on a partition (no deadlock, no
wasted application) under READ COMMITTED and SERIALIZABLE."""

from __future__ import annotations

import multiprocessing
import random
import threading

import psycopg
import pytest

from waltz_client import DatabaseCallbacks
from waltz_client.dbapi import DatabaseSetupError, table_ddl
from waltz_client.transaction import Transaction
from waltz_client.wire.records import ReqId

pytestmark = pytest.mark.timeout(120)

PARTITIONS = 4
ACCOUNTS = 16  # four per partition: transfers collide often
INITIAL = 1000


def txn(txid: int, partition: int = 0, data: bytes = b"") -> Transaction:
    async def fetch() -> bytes:
        return data

    return Transaction(txid, partition, 0, ReqId(1, 1, partition, txid), fetch, lambda: data)


def transfer_log(per_partition: int, seed: int = 7) -> dict[int, list[tuple[int, int, int]]]:
    """(from, to, amount) transfers of each partition, accounts of that partition only."""
    rng = random.Random(seed)
    log: dict[int, list[tuple[int, int, int]]] = {}
    for p in range(PARTITIONS):
        accounts = [a for a in range(ACCOUNTS) if a % PARTITIONS == p]
        log[p] = [(*rng.sample(accounts, 2), rng.randint(1, 9)) for _ in range(per_partition)]
    return log


def replay(log: dict[int, list[tuple[int, int, int]]]) -> dict[int, int]:
    balances = dict.fromkeys(range(ACCOUNTS), INITIAL)
    for transfers in log.values():
        for source, target, amount in transfers:
            balances[source] -= amount
            balances[target] += amount
    return balances


class Bank:
    """Accounts in one PostgreSQL database, updated the way an application would: the
    source account first, then the target (so two appliers of different transfers can
    wait on each other's rows in opposite orders)."""

    def __init__(self, url: str, isolation: str = "read committed") -> None:
        self.url = url
        self.isolation = isolation
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance BIGINT)")
            conn.execute("CREATE TABLE applied (p INTEGER, t BIGINT, PRIMARY KEY (p, t))")
            conn.cursor().executemany(
                "INSERT INTO accounts VALUES (%s, %s)", [(a, INITIAL) for a in range(ACCOUNTS)]
            )
        self.log: dict[int, list[tuple[int, int, int]]] = {}

    def connect(self) -> psycopg.Connection:
        conn = psycopg.connect(self.url)
        conn.execute(f"SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL {self.isolation}")
        conn.commit()
        return conn

    def apply(self, cursor, transaction: Transaction) -> None:
        source, target, amount = self.log[transaction.partition_id][transaction.transaction_id]
        cursor.execute("UPDATE accounts SET balance = balance - %s WHERE id = %s", (amount, source))
        cursor.execute("UPDATE accounts SET balance = balance + %s WHERE id = %s", (amount, target))
        cursor.execute(
            "INSERT INTO applied VALUES (%s, %s)",
            (transaction.partition_id, transaction.transaction_id),
        )

    def callbacks(self, **kwargs) -> DatabaseCallbacks:
        return DatabaseCallbacks(self.connect, self.apply, **kwargs)

    def query(self, sql: str) -> list[tuple]:
        with psycopg.connect(self.url) as conn:
            return conn.execute(sql).fetchall()

    def balances(self) -> dict[int, int]:
        return dict(self.query("SELECT id, balance FROM accounts"))

    def marks(self) -> dict[int, int]:
        return dict(self.query("SELECT partition_id, high_water_mark FROM waltz_high_water_marks"))


@pytest.fixture
def bank(postgres, database) -> Bank:
    return Bank(postgres.url(database))


def test_the_drivers_paramstyle_is_used(bank: Bank) -> None:
    assert psycopg.paramstyle == "pyformat"  # which the callbacks once refused
    bank.log = transfer_log(3)
    cb = bank.callbacks()
    for t in range(3):
        cb.apply_transaction(txn(t, 2))
    assert cb.client_high_water_mark(2) == 2
    assert cb.client_high_water_mark(1) == -1
    assert bank.marks() == {2: 2}
    assert bank.balances() == replay({2: bank.log[2]})
    cb.close()


@pytest.mark.parametrize("style", ["format", "pyformat"])
def test_explicit_paramstyles(bank: Bank, style: str) -> None:
    bank.log = transfer_log(2)
    cb = bank.callbacks(paramstyle=style)
    cb.apply_transaction(txn(0, 1))
    cb.apply_transaction(txn(1, 1))
    assert bank.marks() == {1: 1}
    cb.close()


def test_autocommit_connection_is_refused(bank: Bank) -> None:
    bank.log = transfer_log(1)
    cb = DatabaseCallbacks(lambda: psycopg.connect(bank.url, autocommit=True), bank.apply)
    with pytest.raises(DatabaseSetupError, match="autocommit"):
        cb.apply_transaction(txn(0))
    with pytest.raises(DatabaseSetupError, match="autocommit"):
        cb.client_high_water_mark(0)
    assert bank.balances() == dict.fromkeys(range(ACCOUNTS), INITIAL)
    assert (
        bank.query("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")[0][0]
        == 1
    )  # the refused connections were closed (only this query's remains)


def test_a_failed_apply_is_rolled_back_and_the_connection_reused(bank: Bank) -> None:
    bank.log = transfer_log(2)
    fail = [True]

    def apply(cursor, transaction: Transaction) -> None:
        bank.apply(cursor, transaction)
        if fail[0]:
            cursor.execute("SELECT 1 / 0")  # a failed statement aborts the transaction

    cb = DatabaseCallbacks(bank.connect, apply)
    conn = cb.connection()
    with pytest.raises(psycopg.errors.DivisionByZero):
        cb.apply_transaction(txn(0))
    # neither the balances nor the mark moved, and the same connection works on
    assert bank.balances() == dict.fromkeys(range(ACCOUNTS), INITIAL)
    assert cb.client_high_water_mark(0) == -1
    assert cb.stats.rolled_back == 1
    fail[0] = False
    cb.apply_transaction(txn(0))
    assert cb.connection() is conn
    assert bank.marks() == {0: 0}
    cb.close()


def _first_start(url: str, barrier, errors) -> None:
    try:
        cb = DatabaseCallbacks(lambda: psycopg.connect(url), lambda cur, t: None)
        barrier.wait(30)
        cb.client_high_water_mark(0)
        cb.close()
    except Exception as e:  # reported to the test, which names it
        errors.put(f"{type(e).__name__}: {e}")


def test_concurrent_first_start_of_several_processes(postgres) -> None:
    # Each round: a fresh database and 8 processes creating the mark table at once
    # (CREATE TABLE IF NOT EXISTS alone fails some with UniqueViolation on pg_type).
    ctx = multiprocessing.get_context("fork")  # no connection is open in this process
    errors = ctx.Queue()
    for _ in range(3):
        url = postgres.url(postgres.create_database("race"))
        barrier = ctx.Barrier(8)
        procs = [ctx.Process(target=_first_start, args=(url, barrier, errors)) for _ in range(8)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0] * 8
        found = []
        while not errors.empty():
            found.append(errors.get())
        assert found == []
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT count(*) FROM waltz_high_water_marks").fetchone() == (0,)


@pytest.fixture
def app_role(postgres, database) -> str:
    """A role that may log in and use the database's tables it is granted, but (as
    PostgreSQL 15 has it by default) not create tables in schema public."""
    role = f"app_{database}"
    with postgres.admin(database) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance BIGINT)")
        conn.execute(f"GRANT SELECT, UPDATE ON accounts TO {role}")
        conn.execute("INSERT INTO accounts VALUES (0, 10), (1, 10)")
    with (
        pytest.raises(psycopg.errors.InsufficientPrivilege),
        psycopg.connect(postgres.url(database, role)) as conn,
    ):
        conn.execute("CREATE TABLE t (x INTEGER)")
    return role


def _move_one(cursor, transaction: Transaction) -> None:
    cursor.execute("UPDATE accounts SET balance = balance - 1 WHERE id = 0")
    cursor.execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")


def test_least_privilege_role_without_the_table_gets_the_ddl(postgres, database, app_role) -> None:
    url = postgres.url(database, app_role)
    cb = DatabaseCallbacks(lambda: psycopg.connect(url), _move_one)
    with pytest.raises(DatabaseSetupError) as info:
        cb.client_high_water_mark(0)
    message = str(info.value)
    assert "waltz_high_water_marks" in message
    assert table_ddl() in message and "SELECT, INSERT, UPDATE" in message
    assert "InsufficientPrivilege" in message  # the database's own reason


def test_least_privilege_role_uses_a_table_made_with_the_ddl(postgres, database, app_role) -> None:
    with postgres.admin(database) as conn:
        conn.execute(table_ddl())
        conn.execute(f"GRANT SELECT, INSERT, UPDATE ON waltz_high_water_marks TO {app_role}")
    url = postgres.url(database, app_role)
    for create_table in (True, False):  # the table exists: no CREATE is attempted
        cb = DatabaseCallbacks(lambda: psycopg.connect(url), _move_one, create_table=create_table)
        mark = cb.client_high_water_mark(0)
        cb.apply_transaction(txn(mark + 1))
        assert cb.client_high_water_mark(0) == mark + 1
        cb.close()
    with postgres.admin(database) as conn:
        assert conn.execute("SELECT balance FROM accounts ORDER BY id").fetchall() == [(8,), (12,)]


def apply_concurrently(bank: Bank, clients: list[DatabaseCallbacks], per_partition: int) -> None:
    """Every client applies every partition's transactions in order, one thread per
    client and partition, all at once: as clients sharing a database do."""
    barrier = threading.Barrier(len(clients) * PARTITIONS)
    failures: list[BaseException] = []

    def run(cb: DatabaseCallbacks, p: int) -> None:
        try:
            barrier.wait(30)
            for t in range(per_partition):
                cb.apply_transaction(txn(t, p))
        except BaseException as e:
            failures.append(e)

    threads = [threading.Thread(target=run, args=(cb, p)) for cb in clients for p in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert failures == []


@pytest.mark.parametrize("isolation", ["read committed", "serializable"])
def test_clients_sharing_a_database_take_turns(postgres, database, isolation: str) -> None:
    bank = Bank(postgres.url(database), isolation)
    per_partition = 150
    bank.log = transfer_log(per_partition)
    clients = [bank.callbacks() for _ in range(3)]
    for cb in clients:
        cb.connection()  # the table exists before the race begins
    deadlocks_before = postgres.deadlocks(database)
    apply_concurrently(bank, clients, per_partition)

    assert bank.balances() == replay(bank.log)
    applied = bank.query("SELECT p, t FROM applied ORDER BY p, t")
    assert applied == [(p, t) for p in range(PARTITIONS) for t in range(per_partition)]
    assert bank.marks() == dict.fromkeys(range(PARTITIONS), per_partition - 1)
    stats = [cb.stats for cb in clients]
    assert sum(s.applied for s in stats) == PARTITIONS * per_partition
    assert sum(s.already_applied for s in stats) == 2 * PARTITIONS * per_partition
    # None deadlocked and no application was undone for another client's: appliers of
    # a partition queue on its mark row before touching an account. (SERIALIZABLE's
    # predicate locks are coarser than rows: it may abort an application that overlaps
    # one of another partition, and then it runs again.)
    assert postgres.deadlocks(database) == deadlocks_before
    if isolation == "read committed":
        assert [s.rolled_back for s in stats] == [0, 0, 0]
    else:
        # those aborts are few, and none reached the client (no failure above): each was
        # run again inside the callbacks, or found applied meanwhile by another client
        # (then counted already applied, not retried: so no bound by `retried` here)
        undone = sum(s.rolled_back for s in stats)
        assert undone < 0.05 * PARTITIONS * per_partition  # 0.95 per transaction before
    for cb in clients:
        cb.close()


def test_serialization_failures_are_retried(postgres, database) -> None:
    # Two clients apply transactions of different partitions that read and write the
    # same rows under SERIALIZABLE: PostgreSQL aborts one of a conflicting pair, and
    # the callbacks run it again rather than failing the delivery.
    bank = Bank(postgres.url(database), "serializable")

    def apply(cursor, transaction: Transaction) -> None:
        cursor.execute("SELECT sum(balance) FROM accounts")  # reads what the other writes
        cursor.execute(
            "UPDATE accounts SET balance = balance + 1 WHERE id = %s", (transaction.partition_id,)
        )

    clients = [DatabaseCallbacks(bank.connect, apply) for _ in range(2)]
    for cb in clients:
        cb.connection()
    barrier = threading.Barrier(2)
    failures: list[BaseException] = []

    def run(cb: DatabaseCallbacks, p: int) -> None:
        try:
            barrier.wait(30)
            for t in range(60):
                cb.apply_transaction(txn(t, p))
        except BaseException as e:
            failures.append(e)

    threads = [threading.Thread(target=run, args=(clients[p], p)) for p in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert failures == []
    assert bank.marks() == {0: 59, 1: 59}
    balances = bank.balances()
    assert (balances[0], balances[1]) == (INITIAL + 60, INITIAL + 60)
    assert sum(cb.stats.retried for cb in clients) > 0  # the conflict did happen
