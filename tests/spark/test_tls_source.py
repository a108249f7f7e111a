"""The source and the sink on a cluster that runs every link on mutual TLS, ZooKeeper
included (its TLS port only): the options tlsCert/tlsKey/tlsCa reach the servers and
zkTlsCert/zkTlsKey/zkTlsCa reach ZooKeeper, on the driver and on every executor."""

from __future__ import annotations

import pytest
from spark_helpers import append, log_rows, read, spark_rows

from waltz_client.spark.options import WaltzOptionError, parse_read_options
from waltz_client.spark.split_reader import client_config
from waltz_client.tools.local.cluster import LocalCluster

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def tls_cluster(zookeeper, tmp_path):
    """A cluster on an embedded ZooKeeper of its own, which listens on TLS too (the
    shared ``zookeeper`` is asked for only to skip where Java or the jars are missing)."""
    cluster = LocalCluster(str(tmp_path / "tls"), storages=3, partitions=2, servers=1, tls=True)
    cluster.start()
    try:
        assert cluster.zk_tls() is not None  # the connect string names ZooKeeper's TLS port
        append(cluster, 40, [0, 1], tag="tls")
        yield cluster
    finally:
        cluster.stop()


def tls_options(cluster) -> dict[str, str]:
    tls, zk_tls = cluster.client_tls, cluster.client_zk_tls
    return {
        "zookeeper": cluster.zookeeper_connect,
        "zkRoot": cluster.layout.root,
        "tlsCert": tls.cert,
        "tlsKey": tls.key,
        "tlsCa": tls.ca,
        "zkTlsCert": zk_tls.cert,
        "zkTlsKey": zk_tls.key,
        "zkTlsCa": zk_tls.ca,
    }


def test_a_batch_read_and_a_write_over_tls(spark, tls_cluster):
    options = tls_options(tls_cluster)
    assert spark_rows(read(spark, options)) == sorted(log_rows(tls_cluster))
    rows = spark.createDataFrame(
        [(0, 7, b"spark over tls"), (1, 8, b"again")], "partition int, header int, data binary"
    )
    rows.write.format("waltz").options(**options).mode("append").save()
    written = [r for r in log_rows(tls_cluster) if r[3] in (b"spark over tls", b"again")]
    assert sorted((p, h, d) for p, _, h, d, _ in written) == [
        (0, 7, b"spark over tls"),
        (1, 8, b"again"),
    ]


def test_zookeeper_tls_options_name_the_option_and_reach_the_client(tmp_path):
    from waltz_client.tools.local.certs import local_pki

    files = local_pki(str(tmp_path), {"waltz-client": ["127.0.0.1"]})["waltz-client"]
    ca = files.ca
    read_options = parse_read_options({"zookeeper": "z:1", "zkTlsCa": ca}, streaming=False)
    assert client_config(read_options).zk_tls == read_options.zk_tls
    assert read_options.zk_tls.ca == ca and read_options.zk_tls.cert is None  # a CA alone
    missing = str(tmp_path / "none.pem")
    with pytest.raises(WaltzOptionError, match=f"^zkTlsCa: {missing} does not exist$"):
        parse_read_options({"zookeeper": "z:1", "zkTlsCa": missing}, streaming=True)
    with pytest.raises(WaltzOptionError, match=r"^zkTlsKey: needed with zkTlsCert$"):
        parse_read_options(
            {"zookeeper": "z:1", "zkTlsCert": files.cert, "zkTlsCa": ca},
            streaming=False,
        )
