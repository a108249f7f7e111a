"""What a new user of the source meets first (issue 42): an option that does not apply
to a stream, a ZooKeeper that is not there, and what a restarted stream reports."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import stat
import time
from collections.abc import Callable, Iterator

import pytest
from spark_helpers import append, high_water_marks, read, stream

from waltz_client.cluster.errors import ClusterError
from waltz_client.spark.options import ReadOptions, parse_read_options

pytestmark = pytest.mark.timeout(300)

KAZOO_RETRIES = ("Connection dropped", "Failed connecting to Zookeeper")


def dead_zookeeper() -> str:
    """host:port of a local port nothing listens on (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@contextlib.contextmanager
def driver_stderr(spark) -> Iterator[Callable[[], str | None]]:
    """What the driver (Spark's JVM, which copies its Python workers' stderr to its own)
    writes to stderr during the block: read afterwards from its fd 2, when that is a
    file (pytest's capture); None when it is a terminal or a pipe, which reading would
    steal from."""
    path = f"/proc/{spark.sparkContext._jvm.ProcessHandle.current().pid()}/fd/2"
    try:
        regular = stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        regular = False
    start = os.stat(path).st_size if regular else 0
    text: list[str] = []
    yield lambda: text[0] if text else None
    if regular:
        time.sleep(0.5)  # the JVM copies its workers' output from a thread
        with open(path, "rb") as f:
            f.seek(start)
            text.append(f.read().decode(errors="replace"))


def about(text: str | None, address: str) -> list[str]:
    if text is None:
        return []
    return [line for line in text.splitlines() if address in line or line.startswith(KAZOO_RETRIES)]


def test_ending_offsets_on_a_stream_is_refused_naming_the_option(spark, tmp_path):
    from pyspark.errors import StreamingQueryException

    # Nothing is reached: the refusal comes before the source connects.
    df = stream(spark, {"zookeeper": dead_zookeeper()}, endingOffsets="latest")
    query = df.writeStream.format("noop").option("checkpointLocation", str(tmp_path)).start()
    try:
        with pytest.raises(StreamingQueryException) as failure:
            query.awaitTermination(120)
    finally:
        query.stop()
    message = str(failure.value)
    assert "WaltzOptionError: endingOffsets: applies to batch reads only" in message
    # PySpark's streaming runner buried it behind an error of its own.
    assert "UnboundLocalError" not in message
    assert query.lastProgress is None  # before any batch


def test_a_dead_zookeeper_fails_within_request_timeout_quietly(caplog):
    """In-process: kazoo's per-attempt warnings are demoted to DEBUG while the source
    connects, and the error says how it went."""
    from waltz_client.spark.zookeeper import connect_zookeeper

    caplog.set_level(logging.DEBUG)
    # An earlier test in this process may have quietened kazoo (the CLI sets it to ERROR).
    caplog.set_level(logging.DEBUG, logger="kazoo")
    address = dead_zookeeper()
    options = parse_read_options({"zookeeper": address, "requestTimeout": "1"}, streaming=False)
    began = time.monotonic()
    with pytest.raises(ClusterError) as failure:
        connect_zookeeper(options)
    assert time.monotonic() - began < 5
    message = str(failure.value)
    assert message.startswith(f"WaltzSource[zookeeper={address}, root=/waltz, partitions=all]: ")
    assert f"ZooKeeper at {address} did not answer within 1 s" in message
    assert "(the options zookeeper and requestTimeout; " in message
    assert "the last: Connection dropped: socket connection error" in message
    kazoo = [r for r in caplog.records if r.name == "kazoo.client"]
    assert all(r.levelno < logging.WARNING for r in kazoo), kazoo
    dropped = [r for r in kazoo if r.getMessage().startswith("Connection dropped")]
    assert dropped and all(r.levelno == logging.DEBUG for r in dropped)
    # Once the connect is over, kazoo's logger is as it was.
    logging.getLogger("kazoo.client").warning("Connection dropped: after")
    assert caplog.records[-1].levelno == logging.WARNING


def test_a_client_that_loses_zookeeper_logs_the_outage_once(caplog):
    """Past the connect: a kazoo client retrying a ZooKeeper that is gone (a Python
    worker's cached client of a cluster since stopped) logs the first failed attempt
    at WARNING, the rest at DEBUG."""
    from kazoo.client import KazooClient

    import waltz_client.spark.zookeeper  # noqa: F401  (installs the filter)

    caplog.set_level(logging.DEBUG)
    # An earlier test in this process may have quietened kazoo (the CLI sets it to ERROR).
    caplog.set_level(logging.DEBUG, logger="kazoo")
    zk = KazooClient(hosts=dead_zookeeper(), logger=logging.getLogger("kazoo.client"))
    zk.start_async()
    time.sleep(1.5)
    zk.stop()
    zk.close()
    dropped = [r for r in caplog.records if r.getMessage().startswith(KAZOO_RETRIES)]
    assert len(dropped) > 2
    assert [r.levelno for r in dropped if r.levelno >= logging.WARNING] == [logging.WARNING]


# Seconds: a failure this soon came from requestTimeout=2, not from the default.
SOONER_THAN_DEFAULT = ReadOptions.request_timeout - 5


def test_a_dead_zookeeper_fails_a_batch_read_and_a_stream_within_request_timeout(spark, tmp_path):
    from pyspark.errors import StreamingQueryException

    address = dead_zookeeper()
    options = {"zookeeper": address, "requestTimeout": "2"}
    expected = f"ZooKeeper at {address} did not answer within 2 s"

    with driver_stderr(spark) as batch_stderr:
        began = time.monotonic()
        with pytest.raises(Exception, match="requestTimeout") as failure:
            read(spark, options).collect()
        took = time.monotonic() - began
    assert expected in str(failure.value)
    # Sooner than the default requestTimeout could have: a busy machine adds
    # Spark's own scheduling to the 2 s (a CI run took 9.6 s).
    assert took < SOONER_THAN_DEFAULT, f"the batch read failed after {took:.1f} s"

    with driver_stderr(spark) as stream_stderr:
        began = time.monotonic()
        query = (
            stream(spark, options)
            .writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path))
            .start()
        )
        try:
            with pytest.raises(StreamingQueryException, match="requestTimeout") as failure:
                query.awaitTermination(60)
        finally:
            query.stop()
        took = time.monotonic() - began
    assert expected in str(failure.value)
    assert took < SOONER_THAN_DEFAULT, f"the stream failed after {took:.1f} s"

    # kazoo's retries (a few a second) stay out of the driver's stderr: what is there
    # is Spark's own report of the failed stream, a line (the batch's goes to the caller).
    for written in (batch_stderr(), stream_stderr()):
        lines = about(written, address)
        assert not [line for line in lines if line.startswith(KAZOO_RETRIES)], lines
        assert len(lines) <= 2, lines


def test_a_restarted_stream_reports_its_latest_offset(spark, cluster, source_options, tmp_path):
    """After a restart between batches the first progress has latestOffset. A batch
    that a restart runs again (the last run stopped or failed inside it) is the one
    exception: Spark takes it from the offset log without asking any source for its
    latest offset (MicroBatchExecution.constructNextBatch does not run for it), so that
    progress has none, whatever the source; the next trigger's has it."""
    from pyspark.sql.functions import col, udf
    from pyspark.sql.types import LongType

    checkpoint, poison = tmp_path / "checkpoint", tmp_path / "poison"
    mark = high_water_marks(cluster)[0]
    df = stream(
        spark,
        source_options,
        partitions="0",
        maxTransactionsPerTrigger="4",
        startingOffsets=json.dumps({"0": mark + 1}),
    )
    marker = str(poison)

    @udf(LongType())
    def fail_if_armed(transaction_id):
        if os.path.exists(marker):
            raise RuntimeError("injected failure inside a micro-batch")
        return transaction_id

    failing = df.withColumn("transaction_id", fail_if_armed(col("transaction_id")))

    def run() -> list[dict]:
        query = (
            failing.writeStream.format("noop")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        try:
            query.awaitTermination()
        finally:
            query.stop()
        return [p["sources"][0] for p in query.recentProgress]

    def offsets(sources: list[dict], which: str) -> list[dict | None]:
        return [json.loads(s[which]) for s in sources]

    def at(n: int) -> dict:
        return {"0": mark + n}

    append(cluster, 8, [0], tag="r1")
    poison.write_text("armed")
    with pytest.raises(Exception, match="injected failure"):
        run()  # fails inside its first batch
    poison.unlink()
    rerun = run()  # runs the failed batch again, then the next one
    assert offsets(rerun, "endOffset") == [at(5), at(9)]
    assert offsets(rerun, "latestOffset") == [None, at(9)]  # Spark's None: see above

    append(cluster, 4, [0], tag="r2")
    restarted = run()  # restarted between batches
    assert offsets(restarted, "startOffset") == [at(9)]
    assert offsets(restarted, "latestOffset") == [at(13)]
    # Spark describes every Python stream by its own class: no source can change it
    # (docs/spark.md, "Monitoring a stream"); describe() is what messages use instead.
    assert "python.PythonMicroBatchStream" in restarted[0]["description"]


def test_describe_names_the_cluster_and_the_partitions():
    from waltz_client.spark.zookeeper import describe

    o = parse_read_options({"zookeeper": "zk:2181", "partitions": "3,0-2,7"}, streaming=True)
    assert describe(o) == "WaltzSource[zookeeper=zk:2181, root=/waltz, partitions=0-3,7]"
