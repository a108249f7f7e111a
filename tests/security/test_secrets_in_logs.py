"""The cluster key is a secret (a bearer credential to storage nodes without mutual
TLS): no daemon writes it to its log, only its fingerprint (issue 39, row 9)."""

from __future__ import annotations

import pathlib

from waltz_client.cluster import admin
from waltz_client.cluster.metadata import key_fingerprint
from waltz_client.cluster.zk import close, connect


def test_no_daemon_logs_the_cluster_key(make_cluster, zookeeper):
    cluster = make_cluster(partitions=2, storages=3, servers=1)
    zk = connect(zookeeper.connect_string, timeout=10.0)
    try:
        key = admin.read_params(zk, cluster.layout.root).key
    finally:
        close(zk)
    logs = {
        process.log_path: pathlib.Path(process.log_path).read_text(errors="replace")
        for process in [*cluster.storages, *cluster.servers]
    }
    storage_logs = [text for path, text in logs.items() if "storage" in path]
    assert storage_logs and all(key_fingerprint(key) in text for text in storage_logs)
    for path, text in logs.items():
        for form in (str(key), key.hex):
            assert form not in text, f"{path} shows the cluster key"
