"""The per-partition access policy on a mutual-TLS cluster: which client certificate
identities may read or append which partitions, enforced by the servers, changed live
with ``waltz cluster grant``/``revoke``, and refused with FORBIDDEN and a clear reason."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest
from kazoo.exceptions import NoAuthError

from waltz_client import Forbidden, SubmitStatus, WaltzClient, WaltzClientConfig
from waltz_client.cluster import admin
from waltz_client.cluster.paths import ClusterPaths
from waltz_client.cluster.zk import close, connect
from waltz_client.runtime.tls import TlsFiles
from waltz_client.tools.local.certs import local_pki
from waltz_client.transaction import TransactionBuilder, TransactionContext

pytestmark = pytest.mark.timeout(300)


class Put(TransactionContext):
    def __init__(self, partition_id: int, data: bytes) -> None:
        self.partition_id_ = partition_id
        self.data = data
        self.max_retries = 3

    def partition_id(self, num_partitions: int) -> int:
        return self.partition_id_

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_header(7)
        builder.set_data(self.data)
        return True


def waltz_cluster(cluster, *args: str) -> subprocess.CompletedProcess:
    """``waltz cluster ...`` as an operator runs it, with the cluster's ZooKeeper credential."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "waltz_client.tools.cli",
            "cluster",
            *args,
            "--zookeeper",
            cluster.zookeeper_connect,
            "--root",
            cluster.layout.root,
            "--zk-auth-file",
            cluster.zk_auth_file,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def config_for(cluster, files: TlsFiles) -> WaltzClientConfig:
    return WaltzClientConfig(
        cluster.zookeeper_connect,
        zk_root=cluster.layout.root,
        feed=False,
        tls=files,
        request_timeout=10.0,
    )


def eventually(check, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            check()
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_the_access_policy_decides_who_reads_and_appends_each_partition(make_cluster):
    cluster = make_cluster(partitions=2, tls=True)
    assert cluster.client_tls is not None
    pki = os.path.dirname(cluster.client_tls.cert)
    ids = local_pki(pki, {name: ["127.0.0.1"] for name in ("writer", "auditor", "mallory")})

    # Partition 0: "writer" appends, "auditor-*" reads; every other partition: nobody.
    for args in (
        ("grant", "writer", "--partitions", "0", "--append"),
        ("grant", "auditor*", "--partitions", "0", "--read"),
        ("grant", "nobody", "--partitions", "default", "--read"),
        ("revoke", "nobody", "--partitions", "default", "--read"),
    ):
        proc = waltz_cluster(cluster, *args)
        assert proc.returncode == 0, proc.stderr
    shown = waltz_cluster(cluster, "access")
    assert shown.stdout.splitlines() == [
        "partition 0: read auditor*; append writer",
        "every other partition: read nobody; append nobody",
    ]

    # Only the cluster's credential may change the policy.
    zk = connect(cluster.zookeeper_connect)
    try:
        with pytest.raises(NoAuthError):
            zk.set(ClusterPaths.of(cluster.layout.root).access, b"{}")
    finally:
        close(zk)

    async def submit(files: TlsFiles, partition: int, data: bytes):
        async with WaltzClient(config_for(cluster, files)) as client:
            return await client.submit(Put(partition, data))

    async def read(files: TlsFiles, partition: int) -> list[bytes]:
        async with WaltzClient(config_for(cluster, files)) as client:
            return [r.data async for r in client.read(partition)]

    async def scenario() -> None:
        # The writer appends to partition 0, but may not read its data.
        for i in range(5):
            result = await submit(ids["writer"], 0, b"w%d" % i)
            assert result.status == SubmitStatus.COMMITTED, result
        with pytest.raises(Forbidden, match="identity 'writer' may not read the data of"):
            await read(ids["writer"], 0)
        # The auditor reads it, but may not append.
        assert await read(ids["auditor"], 0) == [b"w%d" % i for i in range(5)]
        result = await submit(ids["auditor"], 0, b"forged")
        assert result.status == SubmitStatus.FAILED
        assert result.attempts == 1  # refused outright: no retry
        assert "FORBIDDEN: identity 'auditor' may not append to partition 0" in result.reason
        # Mallory may not even mount; nobody may touch partition 1.
        result = await submit(ids["mallory"], 0, b"forged")
        assert result.status == SubmitStatus.FAILED
        assert "identity 'mallory' may not mount or follow partition 0" in result.reason
        result = await submit(ids["writer"], 1, b"elsewhere")
        assert result.status == SubmitStatus.FAILED and "partition 1" in result.reason
        with pytest.raises(Forbidden):
            await read(cluster.client_tls, 1)
        # Nothing refused reached the log.
        assert await read(ids["auditor"], 0) == [b"w%d" % i for i in range(5)]

    asyncio.run(scenario())

    # A grant takes effect on the running servers, without a restart.
    proc = waltz_cluster(cluster, "grant", "mallory", "--partitions", "0-1", "--append", "--read")
    assert proc.returncode == 0, proc.stderr

    def mallory_appends() -> None:
        result = asyncio.run(submit(ids["mallory"], 1, b"m"))
        assert result.status == SubmitStatus.COMMITTED, result

    eventually(mallory_appends)
    assert asyncio.run(read(ids["mallory"], 1)) == [b"m"]

    # Opening partition 1 again (no rule, no default): anyone of the CA may use it.
    for args in (
        ("open-access", "--partitions", "default"),
        ("revoke", "mallory", "--partitions", "1", "--append", "--read"),
    ):
        assert waltz_cluster(cluster, *args).returncode == 0

    # Partition 1 still has its own (now empty) rule: revoking the last identity
    # closes it rather than opening it to everyone.
    def refused() -> None:
        try:
            asyncio.run(read(cluster.client_tls, 1))
        except Forbidden:
            return
        raise AssertionError("partition 1 is still open")

    eventually(refused)
    assert waltz_cluster(cluster, "open-access", "--partitions", "1").returncode == 0
    eventually(lambda: _reads(cluster, [b"m"]))
    assert "FORBIDDEN" not in cluster.servers[0].log_tail(200)  # refusals are not logged
    zk = cluster.zk_connect()
    try:
        policy, _ = admin.read_access(zk, cluster.layout.root)
        assert policy.default is None and set(policy.partitions) == {0}
        # A hand-edited policy the servers cannot read: they keep the last good one.
        zk.set(ClusterPaths.of(cluster.layout.root).access, b'{"partitions": {"0": 1}}')
    finally:
        close(zk)
    eventually(lambda: _in_log(cluster, "ignoring an unreadable access policy"))
    with pytest.raises(Forbidden, match="'writer' may not read"):
        asyncio.run(read(ids["writer"], 0))


def _in_log(cluster, text: str) -> None:
    assert text in cluster.servers[0].log_tail(200)


def _reads(cluster, expected: list[bytes]) -> None:
    async def read() -> list[bytes]:
        async with WaltzClient(config_for(cluster, cluster.client_tls)) as client:
            return [r.data async for r in client.read(1)]

    try:
        assert asyncio.run(read()) == expected
    except Forbidden as e:
        raise AssertionError(str(e)) from None
