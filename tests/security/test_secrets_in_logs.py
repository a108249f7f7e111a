"""What the daemons' logs say about their secrets and their security: the cluster key
(a bearer credential to storage nodes without mutual TLS) never, only its fingerprint;
plain text, once, at WARNING (issue 39)."""

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
    logs = _logs(cluster)
    storage_logs = [text for path, text in logs.items() if "storage" in path]
    assert storage_logs and all(key_fingerprint(key) in text for text in storage_logs)
    for path, text in logs.items():
        for form in (str(key), key.hex):
            assert form not in text, f"{path} shows the cluster key"


def _logs(cluster) -> dict[str, str]:
    return {
        process.log_path: pathlib.Path(process.log_path).read_text(errors="replace")
        for process in [*cluster.storages, *cluster.servers]
    }


def test_a_daemon_in_plain_text_says_so_once(make_cluster):
    for path, text in _logs(make_cluster(partitions=1, storages=1, servers=1)).items():
        warnings = [line for line in text.splitlines() if "PLAIN TEXT" in line]
        assert len(warnings) == 1 and " WARNING " in warnings[0], path


def test_a_daemon_on_tls_does_not(make_cluster):
    logs = _logs(make_cluster(partitions=1, storages=1, servers=1, tls=True))
    assert logs and not [path for path, text in logs.items() if "PLAIN TEXT" in text]
