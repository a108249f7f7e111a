"""Client IDs a stranger cannot squat (issue 39, rows 1 and 4), end to end on local
clusters: a certificate of the cluster's CA binds every client ID its quota allows and
tries IDs nobody gave it, IDs are bound ahead as an older build let anyone do, and a
real client still mounts and commits at once; the quota is enforced; an anonymous
ZooKeeper session cannot create anything under the cluster; unused bindings are
released while used ones stay; a plain-text cluster allocates IDs the same way."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from kazoo.exceptions import NoAuthError

from waltz_client import WaltzClient, WaltzClientConfig
from waltz_client.cluster.admin import new_client_id
from waltz_client.cluster.client_ids import live_client_ids, read_binding
from waltz_client.cluster.paths import ClusterPaths
from waltz_client.cluster.zk import close, connect
from waltz_client.runtime.tls import TlsContexts, TlsFiles, tls_open_connection
from waltz_client.tools.local.certs import local_pki
from waltz_client.transaction import TransactionBuilder, TransactionContext
from waltz_client.wire.client_messages import (
    AllocateClientIdRequest,
    ClientIdAllocated,
    ErrorCode,
    ErrorResponse,
    MountRequest,
    MountResponse,
    MountStatus,
)
from waltz_client.wire.records import ReqId
from waltz_client.wire.server_connection import ServerConnection

pytestmark = pytest.mark.timeout(300)

QUOTA = 5


class Put(TransactionContext):
    def __init__(self, data: bytes) -> None:
        self.data = data

    def partition(self, num_partitions: int) -> int:
        return 0

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_data(self.data)
        return True


def mallory_of(cluster) -> TlsFiles:
    """A valid certificate of the cluster's CA, with another identity."""
    pki = os.path.dirname(cluster.client_tls.cert)
    return local_pki(pki, {"mallory": ["127.0.0.1"]})["mallory"]


class Raw:
    """A connection that sends what it is told and keeps every answer."""

    def __init__(self, conn: ServerConnection, answers: list) -> None:
        self.conn, self.answers, self._seq = conn, answers, 0

    @classmethod
    async def open(cls, cluster, files: TlsFiles | None) -> Raw:
        answers: list = []
        opener = (
            tls_open_connection(TlsContexts(files, listening=False))
            if files is not None
            else asyncio.open_connection
        )
        port = cluster.servers[0].ready["port"]
        conn = await ServerConnection.connect(
            "127.0.0.1", port, on_message=answers.append, open_connection=opener
        )
        return cls(conn, answers)

    async def ask(self, message_of) -> object:
        self._seq += 1
        q = ReqId(-1, 0, 0, self._seq)
        message = message_of(q)
        self.conn.send(message)
        async with asyncio.timeout(60):
            while not any(a.req_id == message.req_id for a in self.answers):
                if self.conn.closed:
                    raise ConnectionError(self.conn.closed_reason)
                await asyncio.sleep(0.02)
        return next(a for a in self.answers if a.req_id == message.req_id)

    async def allocate(self) -> object:
        return await self.ask(AllocateClientIdRequest)


def test_a_stranger_cannot_squat_client_ids_and_its_quota_holds(make_cluster):
    cluster = make_cluster(
        partitions=1, storages=1, tls=True, server_args=["--client-id-quota", str(QUOTA)]
    )
    mallory = mallory_of(cluster)
    generation = cluster.ownership()[0][1]
    zk = cluster.zk_connect()  # the admin credential: to play an older build's server
    paths = ClusterPaths.of(cluster.layout.root)

    async def attack() -> tuple[list[int], list]:
        raw = await Raw.open(cluster, mallory)
        got = []
        for _ in range(QUOTA):
            answer = await raw.allocate()
            assert isinstance(answer, ClientIdAllocated), answer
            got.append(answer.client_id)
        over = await raw.allocate()
        # Its own IDs work.
        mount = await raw.ask(lambda q: MountRequest(ReqId(got[0], generation, 0, 99), -1, 1))
        await raw.conn.close()
        # An ID nobody gave it: refused, and nothing is bound.
        raw = await Raw.open(cluster, mallory)
        ahead = got[-1] + 2
        refused = await raw.ask(lambda q: MountRequest(ReqId(ahead, generation, 0, 1), -1, 1))
        await asyncio.wait_for(raw.conn.closed_event.wait(), 30)
        return got, [over, mount, refused, ahead]

    got, (over, mount, refused, ahead) = asyncio.run(attack())
    assert len(set(got)) == QUOTA
    assert isinstance(over, ErrorResponse) and over.code == ErrorCode.LIMIT_EXCEEDED
    assert f"'mallory' holds {QUOTA} client IDs, its quota (client_id_quota {QUOTA})" in (
        over.message
    )
    assert isinstance(mount, MountResponse) and mount.status == MountStatus.READY
    assert isinstance(refused, ErrorResponse) and refused.code == ErrorCode.UNAUTHORIZED
    assert refused.message == (
        f"client ID {ahead} was not allocated to identity 'mallory'; allocate one with "
        f"AllocateClientId (WaltzClient does)"
    )
    try:
        assert read_binding(zk, cluster.layout.root, ahead) is None
        assert live_client_ids(zk, cluster.layout.root, "mallory") == sorted(got)
        # What an older build let any certificate do: bind the next IDs ahead by using
        # them first. 50 of them, as the attacker did.
        nxt = new_client_id(zk, cluster.layout.root) + 1
        txn = zk.transaction()
        for client_id in range(nxt, nxt + 50):
            txn.create(paths.client_binding(client_id), b"mallory")
        assert not any(isinstance(r, Exception) for r in txn.commit())
    finally:
        close(zk)

    config = WaltzClientConfig(
        cluster.zookeeper_connect,
        zk_root=cluster.layout.root,
        feed=False,
        tls=cluster.client_tls,
        mount_timeout=20.0,
    )

    async def real_client() -> tuple[int, list[bool], float]:
        started = time.monotonic()
        async with WaltzClient(config) as client:
            results = [await client.submit(Put(b"ok-%d" % i)) for i in range(3)]
            outcomes = [(r.committed, r.attempts) for r in results]
            return client.client_id, outcomes, time.monotonic() - started

    client_id, committed, took = asyncio.run(asyncio.wait_for(real_client(), 120))
    assert committed == [(True, 1)] * 3  # each at its first attempt
    assert client_id not in range(nxt, nxt + 50) and client_id not in got
    print(f"the real client committed 3 transactions {took:.1f} s after starting")
    zk = cluster.zk_connect()
    try:
        assert read_binding(zk, cluster.layout.root, client_id)[0] == "waltz-client"
        anonymous = connect(cluster.zookeeper_connect)
        try:
            _nobody_creates_anything(anonymous, zk, paths)
        finally:
            close(anonymous)
    finally:
        close(zk)


def _nobody_creates_anything(anonymous, admin, paths: ClusterPaths) -> None:
    """Row 4: an anonymous session (no credential) cannot create a node anywhere under
    the cluster root, client-ids included, nor change one."""
    nodes = [paths.root]
    i = 0
    while i < len(nodes):
        nodes += [f"{nodes[i]}/{c}" for c in admin.get_children(nodes[i])]
        i += 1
    assert {paths.client_ids, paths.client_bindings, paths.client_identities} <= set(nodes)
    for node in nodes:
        with pytest.raises(NoAuthError):
            anonymous.create(f"{node}/blob", b"x" * 4096)
    with pytest.raises(NoAuthError):
        anonymous.create(f"{paths.client_ids}/id-", b"x" * 4096, sequence=True)
    with pytest.raises(NoAuthError):
        anonymous.set(paths.client_ids, b"x")


def test_unused_client_ids_are_released_and_used_ones_stay(make_cluster):
    retention = 1.5
    cluster = make_cluster(
        partitions=1,
        storages=1,
        tls=True,
        server_args=["--client-id-retention", str(retention)],
    )
    generation = cluster.ownership()[0][1]
    root = cluster.layout.root
    config = WaltzClientConfig(
        cluster.zookeeper_connect, zk_root=root, feed=False, tls=cluster.client_tls
    )

    def binding(client_id: int):
        zk = cluster.zk_connect()
        try:
            return read_binding(zk, root, client_id)
        finally:
            close(zk)

    async def scenario() -> tuple[int, int, object]:
        # An ID allocated and left unused.
        raw = await Raw.open(cluster, cluster.client_tls)
        answer = await raw.allocate()
        assert isinstance(answer, ClientIdAllocated)
        unused = answer.client_id
        await raw.conn.close()
        async with WaltzClient(config) as client:
            assert (await client.submit(Put(b"before"))).committed
            used = client.client_id
            deadline = time.monotonic() + 60
            while binding(unused) is not None:
                assert time.monotonic() < deadline, "the unused binding was never released"
                await asyncio.sleep(0.5)
            # Two retention periods on, the connected client's binding is still there,
            # touched meanwhile (so no server releases it), and it still commits.
            before = time.time()
            await asyncio.sleep(2 * retention)
            identity, last_used = binding(used)
            assert identity == "waltz-client" and last_used >= before - 0.1
            assert (await client.submit(Put(b"after"))).committed
        # The released ID cannot be used again: it was not allocated to anyone now.
        raw = await Raw.open(cluster, cluster.client_tls)
        refused = await raw.ask(lambda q: MountRequest(ReqId(unused, generation, 0, 1), -1, 1))
        await raw.conn.close()
        return unused, used, refused

    unused, used, refused = asyncio.run(scenario())
    assert unused != used
    assert isinstance(refused, ErrorResponse) and refused.code == ErrorCode.UNAUTHORIZED
    assert f"client ID {unused} was not allocated" in refused.message
    assert "released 1 client IDs unused for 1.5 s" in cluster.servers[0].log_tail(200)


def test_a_plain_text_cluster_allocates_client_ids_through_its_servers(make_cluster):
    cluster = make_cluster(partitions=1, storages=1)
    root = cluster.layout.root

    async def scenario() -> tuple[list, int]:
        raw = await Raw.open(cluster, None)
        answers = [await raw.allocate() for _ in range(17)]
        await raw.conn.close()
        config = WaltzClientConfig(cluster.zookeeper_connect, zk_root=root, feed=False)
        async with WaltzClient(config) as client:
            assert (await client.submit(Put(b"plain"))).committed
            return answers, client.client_id

    answers, client_id = asyncio.run(scenario())
    assert all(isinstance(a, ClientIdAllocated) for a in answers[:16])
    ids = [a.client_id for a in answers[:16]]
    assert ids == sorted(set(ids)) and ids[0] >= 0 and ids[-1] < client_id
    # A connection is given 16 at most (each costs ZooKeeper a write).
    assert isinstance(answers[16], ErrorResponse)
    assert (answers[16].code, answers[16].message) == (
        ErrorCode.LIMIT_EXCEEDED,
        "this connection has asked for 16 client IDs (at most 16 a connection)",
    )
    # No identity, nothing bound: nothing grows in ZooKeeper.
    zk = connect(cluster.zookeeper_connect)
    try:
        assert zk.exists(ClusterPaths.of(root).client_bindings) is None
        assert zk.get_children(ClusterPaths.of(root).client_ids) == []
    finally:
        close(zk)
