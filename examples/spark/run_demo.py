"""The Spark example pipeline, end to end on a local cluster:

1. the bank demo's workload (``waltz demo``: three clients with their own databases,
   transfers under write locks, a storage node and a server killed on the way);
2. a streaming job (bank_stream.py) keeping a running balance table, SIGKILLed
   mid-stream and started again from its checkpoint;
3. a batch job (bank_report.py) computing the balances and a per-minute summary;

then checks that the databases, the batch job and the streaming table agree.

    .venv/bin/python examples/spark/run_demo.py        # about a minute
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bank_jobs  # noqa: E402
import bank_report  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

from waltz_client.tools.demo import bank  # noqa: E402
from waltz_client.tools.demo.common import FAST_FAILOVER, fresh_cluster  # noqa: E402
from waltz_client.tools.demo.run import run_bank  # noqa: E402

INITIAL = 1000  # the bank demo's opening balance


def say(message: str) -> None:
    print(f"[spark demo] {message}", flush=True)


def stream_job(cluster, out: str, *more: str) -> subprocess.Popen:
    command = [
        sys.executable,
        os.path.join(HERE, "bank_stream.py"),
        "--zookeeper", cluster.zookeeper_connect,
        "--zk-root", cluster.layout.root,
        "--table", os.path.join(out, "balances"),
        "--checkpoint", os.path.join(out, "checkpoint"),
        *more,
    ]  # fmt: skip
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    log = open(os.path.join(out, "stream.log"), "ab")  # noqa: SIM115 - the child owns it
    return subprocess.Popen(command, env=env, stdout=log, stderr=log, start_new_session=True)


def batches_done(out: str) -> int:
    return len(glob.glob(os.path.join(out, "balances", "_done_*")))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="the Spark example pipeline on a local cluster")
    p.add_argument("--data-dir", default=".waltz-local/spark-demo", help="wiped and reused")
    p.add_argument("--transfers", type=int, default=3000)
    p.add_argument("--no-faults", action="store_true", help="skip the demo's kills")
    p.add_argument("--max-per-trigger", type=int, default=300, help="streaming micro-batch")
    args = p.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    demo = argparse.Namespace(
        clients=3,
        tellers=4,
        transfers=args.transfers,
        partitions=4,
        accounts=40,
        no_faults=args.no_faults,
        database=None,  # each client's bank a sqlite file, which the Spark job checks
        shared_database=False,
    )
    cluster = fresh_cluster(args.data_dir, demo.partitions, 2, FAST_FAILOVER)
    out = os.path.join(cluster.data_dir, "spark")
    say(f"starting a local cluster in {cluster.data_dir}")
    cluster.start(say)
    try:
        os.makedirs(out, exist_ok=True)
        say("1. the bank workload")
        if asyncio.run(run_bank(demo, cluster)) != 0:
            say("the bank workload failed its checks")
            return 1

        say("2. the streaming job, killed after two micro-batches, then run to the end")
        per_trigger = ("--max-per-trigger", str(args.max_per_trigger))
        job = stream_job(cluster, out, *per_trigger)
        deadline = time.monotonic() + 180
        while batches_done(out) < 2 and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        killed_after = batches_done(out)
        say(f"killed the streaming job after {killed_after} micro-batches")
        finish = stream_job(cluster, out, *per_trigger, "--available-now")
        if finish.wait(300) != 0:
            say(f"the restarted streaming job failed: see {out}/stream.log")
            return 1

        say("3. the batch report")
        ours = SparkSession.getActiveSession() is None  # (the tests pass theirs)
        spark = SparkSession.builder.appName("waltz-spark-demo").getOrCreate()
        try:
            count, balances, minutes = bank_report.report(
                spark, cluster.zookeeper_connect, cluster.layout.root, demo.accounts, INITIAL
            )
            streamed = bank_jobs.table_balances(spark, os.path.join(out, "balances"))
        finally:
            if ours:  # its Python workers close their clients while ZooKeeper is still up
                spark.stop()
        databases = [bank.balances(p) for p in sorted(glob.glob(f"{cluster.data_dir}/bank-*.db"))]
    finally:
        say("stopping the cluster")
        cluster.stop()

    print()
    print("=== waltz spark demo report ===")
    print(f"transfers in the log      {count}")
    for minute, n, amount in minutes:
        print(f"  {minute}  {n:6d} transfers  {amount:9d} moved")
    print(f"streaming job             killed after {killed_after} micro-batches, restarted")
    checks = {
        "the batch job's balances equal every client database's": all(
            d == balances for d in databases
        )
        and len(databases) == demo.clients,
        "the streaming table equals the batch job's balances": streamed == balances,
        "total conserved": sum(balances.values()) == demo.accounts * INITIAL,
        "per-minute summary counts every transfer": sum(n for _, n, _ in minutes) == count,
    }
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
