"""`waltz demo --database`: the bank demo with its banks in PostgreSQL, shared by every
client, through its faults; and its refusals of a database it cannot use."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(300)


def demo(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "waltz_client.tools.cli",
            "demo",
            "--data-dir",
            str(tmp_path),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=280,
    )


def test_the_demo_on_a_shared_postgresql_database(tmp_path, postgres, zookeeper_available):
    database = postgres.create_database("demo")
    result = demo(
        tmp_path / "demo",
        "--database",
        postgres.url(database),
        "--shared-database",
        "--transfers",
        "240",
        "--clients",
        "3",
        "--partitions",
        "2",
        "--accounts",
        "12",
    )
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert "SIGKILL storage-1" in out and "SIGKILL server-" in out
    assert "banks                     1: BankDb(" in out and "waltz_demo_shared" in out
    assert "0 rolled back" in out and "0 deadlocks" in out
    assert "FAIL" not in out and out.count("PASS") == 7
    assert postgres.deadlocks(database) == 0


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("bank.db", "--database must be a postgresql:// URL, got 'bank.db'"),
        ("postgresql://nobody@127.0.0.1:1/none", "cannot connect to --database"),
    ],
)
def test_a_database_the_demo_cannot_use_is_refused_before_anything_starts(
    tmp_path, url: str, message: str
):
    result = demo(tmp_path / "demo", "--database", url)
    assert result.returncode == 2
    assert message in result.stdout
    assert not (tmp_path / "demo").exists()  # no cluster was started
