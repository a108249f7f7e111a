"""A local cluster on mutual TLS (``tls=True``): clients reach servers, and servers
storage nodes, over TLS, and the metadata is under ZooKeeper ACLs. It commits and
replicates as usual; a server turns away a client without a certificate, and a storage
node turns away a peer without a certificate of the cluster's CA, and one whose
identity is not a server's."""

from __future__ import annotations

import asyncio
import os

import pytest
from kazoo.exceptions import NoAuthError

from waltz_client import WaltzClient, WaltzClientConfig
from waltz_client.cluster.admin import read_params
from waltz_client.cluster.paths import ClusterPaths
from waltz_client.cluster.zk import close, connect
from waltz_client.runtime.tls import TlsContexts, TlsFiles, tls_open_connection
from waltz_client.tools.local.certs import local_pki
from waltz_client.tools.local.verify import converged_digests
from waltz_client.transaction import TransactionBuilder, TransactionContext
from waltz_client.wire.client_messages import (
    AllocateClientIdRequest,
    ClientIdAllocated,
    ErrorCode,
    HighWaterMarkRequest,
    MountRequest,
    MountResponse,
    MountStatus,
)
from waltz_client.wire.records import ReqId
from waltz_client.wire.server_connection import ServerConnection
from waltz_client.wire.storage_client import StorageClient

pytestmark = pytest.mark.timeout(300)


class Put(TransactionContext):
    def __init__(self, data: bytes) -> None:
        self.data = data

    def partition(self, num_partitions: int) -> int:
        return 0

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_header(0)
        builder.set_data(self.data)
        return True


def test_servers_and_storage_nodes_talk_over_mutual_tls(make_cluster):
    cluster = make_cluster(partitions=1, tls=True)
    assert cluster.pki is not None
    config = WaltzClientConfig(
        cluster.zookeeper_connect, zk_root=cluster.layout.root, feed=False, tls=cluster.client_tls
    )

    async def write_and_read() -> list[bytes]:
        async with WaltzClient(config) as client:
            for i in range(20):
                assert await client.submit(Put(b"tls-%d" % i))
            return [r.data async for r in client.read(0)]

    assert asyncio.run(write_and_read()) == [b"tls-%d" % i for i in range(20)]
    # Every replica holds the same log (read by an admin tool with its own certificate).
    digests = asyncio.run(converged_digests(cluster, {0: 19}))[0]
    assert len(set(digests)) == 1 and "incomplete" not in digests

    zk = connect(cluster.zookeeper_connect)
    try:
        params = read_params(zk, cluster.layout.root)
        # The metadata is under ACLs: servers write it with their credential; a stranger
        # who can reach ZooKeeper reads it but cannot change ownership.
        with pytest.raises(NoAuthError):
            zk.set(ClusterPaths.of(cluster.layout.root).ownership, b"{}")
    finally:
        close(zk)
    port = cluster.storages[0].ready["port"]

    async def attempt(open_connection) -> bool:
        async with await StorageClient.connect(
            "127.0.0.1", port, timeout=10, open_connection=open_connection
        ) as c:
            await c.open(params.key, params.num_partitions)
            return True

    # Plain TCP: the TLS listener gets no handshake it understands.
    with pytest.raises((ConnectionError, OSError, asyncio.IncompleteReadError)):
        asyncio.run(attempt(asyncio.open_connection))
    # The cluster's CA, but a storage node's identity: not a server.
    as_storage = tls_open_connection(TlsContexts(cluster.pki["waltz-storage-1"], listening=False))
    with pytest.raises((ConnectionError, OSError, asyncio.IncompleteReadError)):
        asyncio.run(attempt(as_storage))
    assert "is not one of tls_allowed_peers" in cluster.storages[0].log_tail(50)
    # The admin identity is let in.
    assert asyncio.run(attempt(cluster.storage_open_connection()))


def test_a_server_on_tls_refuses_plain_and_certificate_less_clients(make_cluster, tmp_path):
    cluster = make_cluster(partitions=1, tls=True)
    port = cluster.servers[0].ready["port"]
    assert cluster.client_tls is not None
    no_cert = TlsFiles(ca=cluster.client_tls.ca)
    elsewhere = local_pki(str(tmp_path / "elsewhere"), {"waltz-client": ["127.0.0.1"]})

    async def attempt(open_connection) -> float:
        conn = await ServerConnection.connect("127.0.0.1", port, open_connection=open_connection)
        try:
            conn.send(HighWaterMarkRequest(ReqId(1, 0, 0, 1)))
            await asyncio.wait_for(conn.closed_event.wait(), 10)
        finally:
            await conn.close()
        return True

    for refused in (
        asyncio.open_connection,
        tls_open_connection(TlsContexts(no_cert, listening=False)),
        tls_open_connection(TlsContexts(elsewhere["waltz-client"], listening=False)),
    ):
        with pytest.raises((ConnectionError, OSError, asyncio.IncompleteReadError, TimeoutError)):
            asyncio.run(attempt(refused))


def test_a_client_certificate_cannot_act_as_another_clients_id(make_cluster):
    cluster = make_cluster(partitions=1, tls=True)
    assert cluster.client_tls is not None
    pki = os.path.dirname(cluster.client_tls.cert)
    mallory = local_pki(pki, {"mallory": ["127.0.0.1"]})["mallory"]  # same CA, other name
    port = cluster.servers[0].ready["port"]
    generation = cluster.ownership()[0][1]

    async def send(files, message):
        """Send one request; the answers, and the connection (left open)."""
        answers: list = []
        opener = tls_open_connection(TlsContexts(files, listening=False))
        conn = await ServerConnection.connect(
            "127.0.0.1", port, on_message=answers.append, open_connection=opener
        )
        conn.send(message)
        async with asyncio.timeout(30):
            while not answers and not conn.closed:
                await asyncio.sleep(0.05)
        return answers, conn

    async def allocate(files) -> int:
        """A client ID from the server, bound to the certificate's identity."""
        answers, conn = await send(files, AllocateClientIdRequest(ReqId(-1, 0, 0, 1)))
        await conn.close()
        assert isinstance(answers[0], ClientIdAllocated), answers
        return answers[0].client_id

    async def mount(files, client_id: int):
        return await send(files, MountRequest(ReqId(client_id, generation, 0, 1), -1, 1))

    async def scenario() -> int:
        alice_id = await allocate(cluster.client_tls)
        mallory_id = await allocate(mallory)
        answers, alice = await mount(cluster.client_tls, alice_id)
        assert answers == [MountResponse(ReqId(alice_id, generation, 0, 1), MountStatus.READY)]
        # Mallory's certificate is valid, but alice's ID is alice's.
        answers, conn = await mount(mallory, alice_id)
        assert [(a.code, a.message) for a in answers] == [
            (ErrorCode.UNAUTHORIZED, f"client ID {alice_id} belongs to another identity")
        ]
        await asyncio.wait_for(conn.closed_event.wait(), 10)
        # Its own fresh ID is fine.
        answers, conn = await mount(mallory, mallory_id)
        assert isinstance(answers[0], MountResponse) and answers[0].status == MountStatus.READY
        await conn.close()
        assert not alice.closed
        await alice.close()
        return alice_id

    alice_id = asyncio.run(scenario())
    assert (
        f"identity 'mallory' may not use client ID {alice_id}: client ID {alice_id} belongs "
        f"to another identity" in cluster.servers[0].log_tail(50)
    )
