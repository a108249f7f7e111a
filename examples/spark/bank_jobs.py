"""The bank demo's log, read by Spark: transfers decoded, balances and a per-minute
summary computed, and a running balance table kept by a streaming query.

The bank (``waltz demo``) appends one JSON transaction per transfer:
``{"from": account, "to": account, "amount": n, "at": unix seconds}``. Every account
starts at the same balance, so an account's balance is that plus what it received
minus what it sent.
"""

from __future__ import annotations

import glob
import json
import os

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

TRANSFER = "struct<`from`: int, `to`: int, amount: long, at: double>"


def transfers(log: DataFrame) -> DataFrame:
    """partition, transaction_id, from, to, amount, at: one row per transfer."""
    decoded = log.select(
        "partition",
        "transaction_id",
        F.from_json(F.col("data").cast("string"), TRANSFER).alias("t"),
    )
    return decoded.select("partition", "transaction_id", "t.*")


def movements(transfers_df: DataFrame) -> DataFrame:
    """account, delta: each transfer as a debit and a credit."""
    return transfers_df.select(
        F.explode(
            F.array(
                F.struct(F.col("from").alias("account"), (-F.col("amount")).alias("delta")),
                F.struct(F.col("to").alias("account"), F.col("amount").alias("delta")),
            )
        ).alias("m")
    ).select("m.account", "m.delta")


def balances(transfers_df: DataFrame, accounts: int, initial: int) -> dict[int, int]:
    """Every account's balance after the transfers."""
    totals = dict(movements(transfers_df).groupBy("account").agg(F.sum("delta")).collect())
    return {a: initial + int(totals.get(a) or 0) for a in range(accounts)}


def per_minute(transfers_df: DataFrame) -> list[tuple[str, int, int]]:
    """(minute, transfers, amount moved), in time order."""
    rows = (
        transfers_df.groupBy(F.date_format(F.from_unixtime("at"), "yyyy-MM-dd HH:mm").alias("m"))
        .agg(F.count("*").alias("n"), F.sum("amount").alias("amount"))
        .orderBy("m")
        .collect()
    )
    return [(r.m, r.n, r.amount) for r in rows]


# --- the streaming job's running balance table ----------------------------------------
#
# Each micro-batch writes a new version of the table, table/v=<batch id>, from the
# previous version plus the batch's movements, then a marker file _done_<batch id>. A
# micro-batch Spark runs again after a crash finds its version half-written or done:
# it writes it again from the same previous version (the markers say which), so the
# table is exactly the same whether the query was killed or not.


def _done(table: str) -> list[int]:
    return sorted(int(p.rsplit("_", 1)[1]) for p in glob.glob(os.path.join(table, "_done_*")))


def latest_version(spark: SparkSession, table: str, before: int | None = None) -> DataFrame | None:
    versions = [b for b in _done(table) if before is None or b < before]
    if not versions:
        return None
    return spark.read.parquet(os.path.join(table, f"v={versions[-1]}"))


def balance_table_writer(table: str, accounts: int, initial: int):
    """A foreachBatch function keeping ``table`` (account, balance) up to date."""

    def write(batch: DataFrame, batch_id: int) -> None:
        spark = batch.sparkSession
        previous = latest_version(spark, table, before=batch_id)
        if previous is None:
            previous = spark.createDataFrame(
                [(a, initial) for a in range(accounts)], "account int, balance long"
            )
        deltas = movements(transfers(batch)).groupBy("account").agg(F.sum("delta").alias("d"))
        current = previous.join(deltas, "account", "left").select(
            "account", (F.col("balance") + F.coalesce(F.col("d"), F.lit(0))).alias("balance")
        )
        current.coalesce(1).write.mode("overwrite").parquet(os.path.join(table, f"v={batch_id}"))
        with open(os.path.join(table, f"_done_{batch_id}"), "w") as marker:
            json.dump({"batch": batch_id}, marker)

    return write


def table_balances(spark: SparkSession, table: str) -> dict[int, int]:
    version = latest_version(spark, table)
    return {} if version is None else {r.account: r.balance for r in version.collect()}
