"""Fixtures of the operator's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from waltz_client.cluster.zk import close, connect


@pytest.fixture
def zk(zookeeper) -> Iterator[KazooClient]:
    """A client of the shared ZooKeeper, to look at what the operator wrote."""
    client = connect(zookeeper.connect_string, timeout=10.0)
    try:
        yield client
    finally:
        close(client)
