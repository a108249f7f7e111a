"""Fixtures shared by every test directory.

``zookeeper`` is one real ZooKeeper server (a child JVM) for the whole session;
tests keep out of each other's way by working under their own ``zk_root``.
Tests that need ZooKeeper are skipped, with the reason, where Java or the
ZooKeeper jars (``pip install 'waltz[local]'``) are missing.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import settings

from waltz_client.tools.local.cluster import LocalCluster
from waltz_client.tools.local.zookeeper import (
    EmbeddedZooKeeper,
    ZooKeeperUnavailable,
    find_java,
    find_zookeeper_classpath,
)

# Property tests run on a busy 2-core machine beside processes of other tests: a
# per-example deadline only measures the machine's load, so there is none.
settings.register_profile("waltz", deadline=None)
settings.load_profile("waltz")

# Parallel workers (pytest-xdist, `make test`) pick local cluster ports from disjoint
# slices (waltz_client.tools.local.cluster._port_range says why).
if os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw"):
    os.environ["WALTZ_PORT_SLICE"] = (
        f"{int(os.environ['PYTEST_XDIST_WORKER'][2:])}/"
        f"{int(os.environ.get('PYTEST_XDIST_WORKER_COUNT', '1'))}"
    )


# The suite's wall time on 2 cores is set by its tail: `make test` hands whole files to
# 3 workers (--dist loadfile), and a file of minutes started last keeps one worker busy
# after the others ran out. The slowest files and directories go first (in this order;
# measured with --durations: the day-two operator tests take about 3 minutes, the
# simulation's seeds 2), so that the many quick files fill in around them; within a
# rank, the collection order. Every worker sorts the same way, as xdist requires.
SLOW_FIRST = (
    "tests/k8s/test_day_two.py",
    "tests/simulation/",
    "tests/k8s/test_handlers.py",
    "tests/spark/test_example_pipeline.py",
    "tests/faults/",
    "tests/demo/test_smoke.py",
    "tests/k8s/test_operator_live.py",
    "tests/spark/",
    "tests/demo/",
    "tests/k8s/",
    "tests/postgres/",
    "tests/server/",
)


def _rank(item: pytest.Item) -> int:
    path = item.nodeid.split("::", 1)[0]
    return next((i for i, p in enumerate(SLOW_FIRST) if path.startswith(p)), len(SLOW_FIRST))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_rank)  # stable: the collection order within a rank


def require_zookeeper() -> None:
    """Skip the calling test or fixture unless Java and the ZooKeeper jars are here."""
    try:
        find_java()
        find_zookeeper_classpath()
    except ZooKeeperUnavailable as exc:
        pytest.skip(f"ZooKeeper unavailable: {exc}")


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedZooKeeper]:
    """A started ZooKeeper server shared by the session (stopped at its end)."""
    require_zookeeper()
    server = EmbeddedZooKeeper(str(tmp_path_factory.mktemp("zookeeper")))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def zk_root() -> str:
    """A fresh chroot path, e.g. ``/waltz-test-<hex>``, not yet created on the server."""
    return f"/waltz-test-{uuid.uuid4().hex}"


@pytest.fixture
def zookeeper_available() -> None:
    """For tests that start their own ZooKeeper: skip unless Java and the jars are here."""
    require_zookeeper()


# Servers give up a dead peer's partitions after this ZooKeeper session timeout.
FAST_FAILOVER = ["--zk-session-timeout", "4"]


@pytest.fixture
def make_cluster(zookeeper, zk_root, tmp_path) -> Iterator:
    """Start a cluster on the shared ZooKeeper: ``make_cluster(partitions=1, servers=1)``."""
    clusters: list[LocalCluster] = []

    def make(
        *,
        partitions: int = 1,
        servers: int = 1,
        storages: int = 3,
        server_args=(),
        storage_args=(),
        tls: bool = False,
    ) -> LocalCluster:
        cluster = LocalCluster(
            str(tmp_path / f"cluster-{len(clusters)}"),
            storages=storages,
            partitions=partitions,
            replicas=min(3, storages),
            root=zk_root,
            servers=servers,
            server_args=[*FAST_FAILOVER, *server_args],
            storage_args=list(storage_args),
            external_zookeeper=zookeeper.connect_string,
            tls=tls,
        )
        clusters.append(cluster)
        cluster.start()
        return cluster

    yield make
    for cluster in clusters:
        cluster.stop()
