"""A real PostgreSQL server for the DB-API callback tests: one per test process (started
from the machine's PostgreSQL binaries, see waltz_client/tools/local/postgres.py), a fresh
database per test. Without PostgreSQL or psycopg, these tests skip and say why."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from waltz_client.tools.local.postgres import LocalPostgres, PostgresUnavailable

psycopg = pytest.importorskip("psycopg", reason="psycopg is not installed (the postgres extra)")

_names = itertools.count()


class Postgres:
    """The running server, with helpers to make databases and roles."""

    def __init__(self, server: LocalPostgres) -> None:
        self.server = server

    def url(self, dbname: str, user: str = "postgres") -> str:
        return self.server.url(dbname, user)

    def admin(self, dbname: str = "postgres"):
        return psycopg.connect(self.url(dbname), autocommit=True)

    def create_database(self, prefix: str = "test") -> str:
        name = f"{prefix}_{next(_names)}"
        with self.admin() as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return name

    def deadlocks(self, dbname: str) -> int:
        with self.admin() as conn:
            # the statistics collector reports with a delay: ask for a fresh snapshot
            conn.execute("SELECT pg_stat_clear_snapshot()")
            row = conn.execute(
                "SELECT deadlocks FROM pg_stat_database WHERE datname = %s", (dbname,)
            ).fetchone()
        return int(row[0])


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    try:
        server = LocalPostgres().start()
    except PostgresUnavailable as e:
        pytest.skip(f"no PostgreSQL server here: {e}")
    try:
        yield Postgres(server)
    finally:
        server.stop()


@pytest.fixture
def database(postgres: Postgres) -> str:
    """A new empty database's name."""
    return postgres.create_database()
