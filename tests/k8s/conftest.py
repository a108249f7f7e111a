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


@pytest.fixture
def strict_pki(tmp_path):
    """A CA and a server certificate for 127.0.0.1 (``strict_api(pki=...)`` serves HTTPS
    with it); ``.client(user)`` issues client certificates, and
    ``strict_api.write_kubeconfig`` writes kubeconfigs with a token or a certificate."""
    from strict_api import make_pki

    return make_pki(str(tmp_path / "pki"))
