"""Batch job: the bank's balances and a per-minute summary from the log, checked
against the balances the bank clients' databases hold.

    python examples/spark/bank_report.py --zookeeper 127.0.0.1:2181 --zk-root /waltz \
        --accounts 40 --initial 1000 --check-db .waltz-local/spark-demo/bank-0.db

Runs as is under spark-submit (local or on Kubernetes: docs/spark.md).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bank_jobs
from pyspark.sql import SparkSession

from waltz_client.spark import WaltzDataSource


def report(spark: SparkSession, zookeeper: str, zk_root: str, accounts: int, initial: int):
    spark.dataSource.register(WaltzDataSource)
    log = spark.read.format("waltz").option("zookeeper", zookeeper).option("zkRoot", zk_root)
    transfers = bank_jobs.transfers(log.load()).cache()
    try:
        return (
            transfers.count(),
            bank_jobs.balances(transfers, accounts, initial),
            bank_jobs.per_minute(transfers),
        )
    finally:
        transfers.unpersist()


def database_balances(path: str) -> dict[int, int]:
    conn = sqlite3.connect(path)
    try:
        return dict(conn.execute("SELECT id, balance FROM accounts").fetchall())
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--zookeeper", required=True)
    p.add_argument("--zk-root", default="/waltz")
    p.add_argument("--accounts", type=int, default=40)
    p.add_argument("--initial", type=int, default=1000)
    p.add_argument("--check-db", action="append", default=[], help="a bank client's sqlite db")
    args = p.parse_args(argv)
    spark = SparkSession.builder.appName("waltz-bank-report").getOrCreate()
    count, balances, minutes = report(
        spark, args.zookeeper, args.zk_root, args.accounts, args.initial
    )
    print(f"{count} transfers; total balance {sum(balances.values())}")
    for minute, n, amount in minutes:
        print(f"  {minute}  {n:6d} transfers  {amount:9d} moved")
    ok = True
    for path in args.check_db:
        same = database_balances(path) == balances
        ok &= same
        print(f"{'PASS' if same else 'FAIL'}  balances equal those in {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
