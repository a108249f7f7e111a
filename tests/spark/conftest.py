"""One SparkSession (local[2]) and one local Waltz cluster for the Spark tests.

A SparkSession takes seconds to start, so the whole test session shares one; the
cluster (2 servers, 3 storage nodes, 4 partitions) is shared by the Spark tests, which
work out what they expect from the log as it is when they run.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator

import pytest

pyspark = pytest.importorskip("pyspark", reason="the spark extra is not installed")
pytest.importorskip("pyarrow", reason="the spark extra is not installed")

from waltz_client.tools.local.cluster import LocalCluster  # noqa: E402

PARTITIONS = 4


@pytest.fixture(scope="session")
def spark() -> Iterator:
    from pyspark.sql import SparkSession

    from waltz_client.spark import WaltzDataSource

    os.environ["PYSPARK_PYTHON"] = sys.executable  # executors run this venv's Python
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2]")
        .appName("waltz-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(WaltzDataSource)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="package")
def cluster(zookeeper, tmp_path_factory) -> Iterator[LocalCluster]:
    local = LocalCluster(
        str(tmp_path_factory.mktemp("spark-cluster")),
        storages=3,
        partitions=PARTITIONS,
        replicas=3,
        root=f"/waltz-spark-{uuid.uuid4().hex}",
        servers=2,
        server_args=["--zk-session-timeout", "4"],
        external_zookeeper=zookeeper.connect_string,
    )
    local.start()
    try:
        yield local
    finally:
        local.stop()


@pytest.fixture
def source_options(cluster) -> dict[str, str]:
    return {"zookeeper": cluster.zookeeper_connect, "zkRoot": cluster.layout.root}
