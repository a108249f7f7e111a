"""Streaming job: a running balance table (parquet) kept from the bank's log.

    python examples/spark/bank_stream.py --zookeeper 127.0.0.1:2181 --zk-root /waltz \
        --table out/balances --checkpoint out/checkpoint [--available-now]

Kill it at any moment and start it again with the same checkpoint: it goes on from
the last micro-batch Spark recorded, and the table ends the same (bank_jobs.py says
how). ``--available-now`` stops once it has caught up with the log.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bank_jobs
from pyspark.sql import SparkSession

from waltz_client.spark import WaltzDataSource


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--zookeeper", required=True)
    p.add_argument("--zk-root", default="/waltz")
    p.add_argument("--table", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--accounts", type=int, default=40)
    p.add_argument("--initial", type=int, default=1000)
    p.add_argument("--max-per-trigger", type=int, default=500)
    p.add_argument("--available-now", action="store_true")
    args = p.parse_args(argv)
    spark = SparkSession.builder.appName("waltz-bank-stream").getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(WaltzDataSource)
    os.makedirs(args.table, exist_ok=True)
    stream = (
        spark.readStream.format("waltz")
        .option("zookeeper", args.zookeeper)
        .option("zkRoot", args.zk_root)
        .option("maxTransactionsPerTrigger", str(args.max_per_trigger))
        .load()
        .writeStream.foreachBatch(
            bank_jobs.balance_table_writer(args.table, args.accounts, args.initial)
        )
        .option("checkpointLocation", args.checkpoint)
    )
    if args.available_now:
        stream = stream.trigger(availableNow=True)
    query = stream.start()
    query.awaitTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main())
