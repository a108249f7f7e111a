"""How much work clients sharing one PostgreSQL database waste applying the same feed.

Three DatabaseCallbacks objects (three "clients") apply every transaction of 4
partitions into one database, one thread per client and partition, all at once, as
clients sharing a database do: each transfer moves money between two of a partition's
accounts, source first. Prints, per isolation level, how many times ``apply`` ran (each
run beyond one per transaction was undone), PostgreSQL's deadlock count, the errors
that reached the client (it would redeliver those after its backoff) and the rate.

    .venv/bin/python examples/postgres/shared_appliers.py
    # an older DatabaseCallbacks, for a before/after:
    git show 3327acc:waltz_client/dbapi.py > /tmp/old_dbapi.py
    .venv/bin/python examples/postgres/shared_appliers.py --dbapi /tmp/old_dbapi.py

Starts its own PostgreSQL (Debian's binaries, waltz_client/tools/local/postgres.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import threading
import time

import psycopg

from waltz_client.tools.local.postgres import LocalPostgres
from waltz_client.transaction import Transaction
from waltz_client.wire.records import ReqId

PARTITIONS, ACCOUNTS, INITIAL = 4, 16, 1000


def load_callbacks_class(path: str | None):
    if path is None:
        from waltz_client.dbapi import DatabaseCallbacks

        return DatabaseCallbacks, {}
    with open(path) as f:
        source = f.read()
    source = source.replace("from .callbacks", "from waltz_client.callbacks")
    source = source.replace("from .transaction", "from waltz_client.transaction")
    spec = importlib.util.spec_from_loader("old_dbapi", loader=None)
    module = importlib.util.module_from_spec(spec)
    exec(compile(source, path, "exec"), module.__dict__)
    return module.DatabaseCallbacks, {"paramstyle": "format"}  # the old one knew no other


def run(server: LocalPostgres, isolation: str, per_partition: int, cls, kwargs) -> None:
    name = f"appliers_{isolation.replace(' ', '_')}_{int(time.time() * 1000) % 10**8}"
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    url = server.url(name)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance BIGINT)")
        conn.cursor().executemany(
            "INSERT INTO accounts VALUES (%s, %s)", [(a, INITIAL) for a in range(ACCOUNTS)]
        )
    rng = random.Random(7)
    log = {
        p: [
            (*rng.sample([a for a in range(ACCOUNTS) if a % PARTITIONS == p], 2), rng.randint(1, 9))
            for _ in range(per_partition)
        ]
        for p in range(PARTITIONS)
    }
    calls = [0]

    def connect():
        conn = psycopg.connect(url)
        conn.execute(f"SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL {isolation}")
        conn.commit()
        return conn

    def apply(cursor, transaction: Transaction) -> None:
        calls[0] += 1
        source, target, amount = log[transaction.partition_id][transaction.transaction_id]
        cursor.execute("UPDATE accounts SET balance = balance - %s WHERE id = %s", (amount, source))
        cursor.execute("UPDATE accounts SET balance = balance + %s WHERE id = %s", (amount, target))

    def deadlocks() -> int:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SELECT pg_stat_clear_snapshot()")
            return conn.execute(
                "SELECT deadlocks FROM pg_stat_database WHERE datname = %s", (name,)
            ).fetchone()[0]

    clients = [cls(connect, apply, **kwargs) for _ in range(3)]
    for cb in clients:
        cb.connection()
    errors: list[str] = []

    def txn(t: int, p: int) -> Transaction:
        async def fetch() -> bytes:
            return b""

        return Transaction(t, p, 0, ReqId(1, 1, p, t), fetch, lambda: b"")

    def applier(cb, p: int) -> None:
        for t in range(per_partition):
            while True:
                try:
                    cb.apply_transaction(txn(t, p))
                    break
                except Exception as e:  # the client would deliver it again
                    errors.append(type(e).__name__)

    before = deadlocks()
    started = time.perf_counter()
    threads = [threading.Thread(target=applier, args=(cb, p)) for cb in clients for p in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    n = PARTITIONS * per_partition
    time.sleep(1)  # the statistics collector reports deadlocks with a delay
    print(
        f"{isolation:16s} {n} transactions: apply ran {calls[0]} times "
        f"({calls[0] / n - 1:.2f} undone per transaction), {deadlocks() - before} deadlocks, "
        f"{len(errors)} errors reached the client {sorted(set(errors))}, {n / elapsed:.0f} tx/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-partition", type=int, default=300)
    parser.add_argument("--dbapi", help="a dbapi.py of another version to measure instead")
    args = parser.parse_args()
    cls, kwargs = load_callbacks_class(args.dbapi)
    with LocalPostgres() as server:
        for isolation in ("read committed", "serializable"):
            run(server, isolation, args.per_partition, cls, kwargs)


if __name__ == "__main__":
    main()
