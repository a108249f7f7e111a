"""``waltz cluster secure`` on a cluster created open, while a client commits: every node
gets the metadata ACL, anonymous sessions can read but no longer write, the servers
(started with the credential) keep writing, and a live server that is not a writer makes
the command refuse before it changes anything. Real ZooKeeper and daemons throughout."""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import sys
import time

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE, make_digest_acl

from waltz_client import WaltzClient, WaltzClientConfig
from waltz_client.client import SubmitResult
from waltz_client.cluster.acl import ZkCredential, metadata_acl
from waltz_client.cluster.admin import create_cluster, read_params
from waltz_client.cluster.identities import session_identities
from waltz_client.cluster.metadata import ServerRegistration
from waltz_client.cluster.paths import ClusterPaths
from waltz_client.cluster.secure import plan_changes, same_acl, secure_cluster, servers_not_writers
from waltz_client.cluster.zk import close, connect
from waltz_client.tools.local.cluster import LocalCluster
from waltz_client.transaction import TransactionBuilder, TransactionContext

pytestmark = pytest.mark.timeout(300)

FAST_FAILOVER = ["--zk-session-timeout", "4"]
GUARD = 120.0  # hang guards only: every wait ends as soon as its condition holds


class Put(TransactionContext):
    def __init__(self, partition: int, data: bytes) -> None:
        self._partition, self.data = partition, data

    def partition(self, num_partitions: int) -> int:
        return self._partition

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_header(0)
        builder.set_data(self.data)
        return True


async def until(predicate, what: str) -> None:
    deadline = time.monotonic() + GUARD
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {GUARD:g} s waiting for {what}")
        await asyncio.sleep(0.05)


def secure(zk_connect: str, root: str, auth: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            *(sys.executable, "-m", "waltz_client.tools.cli", "cluster", "secure"),
            *("--zookeeper", zk_connect, "--root", root, "--zk-auth-file", auth, *extra),
        ],
        capture_output=True,
        text=True,
        timeout=GUARD,
    )


def tree(zk: KazooClient, root: str) -> list[str]:
    out, stack = [], [root]
    while stack:
        path = stack.pop()
        out.append(path)
        stack.extend(f"{path}/{c}" for c in zk.get_children(path))
    return sorted(out)


def anonymous_writes_refused(anonymous: KazooClient, paths: ClusterPaths, path: str) -> None:
    """Every kind of write an anonymous session could try on ``path`` gets NoAuth. The
    versions given are wrong on purpose: ZooKeeper checks the ACL first, so a write that
    were allowed would fail with BadVersion and change nothing."""
    data, stat = anonymous.get(path)  # reading still works
    with pytest.raises(NoAuthError):
        anonymous.set(path, data, version=stat.version + 1000)
    with pytest.raises(NoAuthError):
        anonymous.set_acls(path, OPEN_ACL_UNSAFE, version=stat.aversion + 1000)
    if path != paths.root:
        with pytest.raises(NoAuthError):  # DELETE on the parent
            anonymous.delete(path, version=stat.version + 1000)
    with pytest.raises(NoAuthError):  # client IDs too: servers allocate them
        anonymous.create(f"{path}/intruder", b"")


def test_securing_an_open_cluster_while_a_client_commits(zookeeper, zk_root, tmp_path):
    auth = tmp_path / "zk-auth"
    auth.write_text(f"waltz:{secrets.token_urlsafe(18)}\n")
    credential = ZkCredential.from_file(str(auth))
    paths = ClusterPaths.of(zk_root)
    cluster = LocalCluster(
        str(tmp_path / "cluster"),
        storages=2,
        partitions=2,
        replicas=2,
        root=zk_root,
        servers=2,
        server_args=FAST_FAILOVER,
        external_zookeeper=zookeeper.connect_string,
        zk_auth_file=str(auth),
    )
    anonymous = connect(zookeeper.connect_string)
    admin = connect(zookeeper.connect_string, credential=credential)
    cluster.start()
    try:
        # Created open: an anonymous session may write (the wrong version is all that
        # stops it), and the servers say they hold the credential.
        with pytest.raises(BadVersionError):
            anonymous.set(paths.ownership, b"{}", version=10**6)
        for i in range(2):
            reg = ServerRegistration.decode(anonymous.get(paths.server(f"server-{i}"))[0])
            assert reg.zk_auth == ("digest:waltz",)
        # A live server of an older build (or without the credential) publishes nothing.
        anonymous.create(
            paths.server("old-server"),
            ServerRegistration("old-server", "127.0.0.1", 1, 2).encode(),
            ephemeral=True,
        )
        config = WaltzClientConfig(cluster.zookeeper_connect, zk_root=zk_root, feed=False)
        results: list[SubmitResult] = []

        async def scenario() -> tuple[subprocess.CompletedProcess, ...]:
            stop = asyncio.Event()
            async with WaltzClient(config) as client:

                async def append() -> None:
                    i = 0
                    while not stop.is_set():
                        results.append(await client.submit(Put(i % 2, b"tx-%d" % i)))
                        i += 1

                writer = asyncio.create_task(append())
                await until(lambda: len(results) >= 20, "appends before")
                refused = await asyncio.to_thread(
                    secure, zookeeper.connect_string, zk_root, str(auth)
                )
                # Nothing changed: the cluster node is still open.
                assert same_acl(admin.get_acls(paths.cluster)[0], OPEN_ACL_UNSAFE)
                anonymous.delete(paths.server("old-server"))  # that server is gone
                done = await asyncio.to_thread(secure, zookeeper.connect_string, zk_root, str(auth))
                before = len(results)
                await until(lambda: len(results) >= before + 20, "appends after securing")
                # The servers write the metadata under the new ACL: server-1 leaves, and
                # server-0 takes its partition over (ownership, partition metadata).
                await asyncio.to_thread(cluster.servers[1].stop)
                await until(
                    lambda: {o for o, _ in cluster.ownership().values()} == {"server-0"},
                    "server-0 to own every partition",
                )
                before = len(results)
                await until(lambda: len(results) >= before + 20, "appends after the move")
                stop.set()
                await writer
            again = await asyncio.to_thread(secure, zookeeper.connect_string, zk_root, str(auth))
            dry = await asyncio.to_thread(
                secure, zookeeper.connect_string, zk_root, str(auth), "--dry-run"
            )
            return refused, done, again, dry

        refused, done, again, dry = asyncio.run(scenario())
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "old-server" in refused.stderr and "nothing changed" in refused.stderr
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"secured {zk_root}:" in done.stdout and "2 of 2 live server(s)" in done.stdout
        assert again.returncode == 0 and "nothing to change" in again.stdout, again.stdout
        assert dry.returncode == 0 and "nothing to change" in dry.stdout, dry.stdout
        # Every append committed, none failed, across the change and the move.
        assert results and all(r.status.name == "COMMITTED" for r in results), [
            r for r in results if r.status.name != "COMMITTED"
        ][:3]

        # Every node carries what CreateCluster with the credential would have written.
        reference = f"{zk_root}-reference"
        create_cluster(admin, reference, "ref", 2, 2, cluster.layout.storage_addresses)
        ref_paths = ClusterPaths.of(reference)
        acl = metadata_acl(credential)
        nodes = tree(admin, zk_root)
        assert paths.client_ids in nodes and paths.server("server-0") in nodes
        for path in nodes:
            if path in (paths.client_ids, paths.cluster):
                wanted = admin.get_acls(path.replace(zk_root, reference, 1))[0]
            else:
                wanted = acl
            assert same_acl(admin.get_acls(path)[0], wanted), path
            anonymous_writes_refused(anonymous, paths, path)
        assert same_acl(admin.get_acls(ref_paths.cluster)[0], acl)
        assert read_params(anonymous, zk_root).num_partitions == 2  # reading still works
    finally:
        cluster.stop()
        close(anonymous)
        close(admin)


def test_a_server_registering_again_after_securing_gets_the_new_acl(zookeeper, zk_root):
    """A server adopted the open ACL at start; after ``secure`` its ZooKeeper session
    expires, and the registration it creates in the new session must carry the new ACL
    (else anyone could rewrite where clients find it)."""
    from waltz_server.coordinator import ServerCoordinator

    credential = ZkCredential("waltz", secrets.token_urlsafe(18))
    paths = ClusterPaths.of(zk_root)
    anonymous = connect(zookeeper.connect_string)
    admin = connect(zookeeper.connect_string, credential=credential)
    create_cluster(anonymous, zk_root, "open", 1, 1, ["127.0.0.1:9000"])

    async def scenario() -> None:
        coordinator = ServerCoordinator(
            zookeeper.connect_string,
            zk_root,
            ServerRegistration(
                "s0", "127.0.0.1", 1, 2, zk_auth=tuple(session_identities(credential))
            ),
            session_timeout=4.0,
            credential=credential,
        )
        await coordinator.start()
        try:
            first = anonymous.exists(paths.server("s0")).ephemeralOwner
            acl = metadata_acl(credential)
            await asyncio.to_thread(secure_cluster, admin, zk_root, acl, acl, settle=0.1)
            # Expire the server's session: a second client with its ID closes it.
            session_id, password = coordinator.zk.client_id
            thief = KazooClient(hosts=zookeeper.connect_string, client_id=(session_id, password))
            await asyncio.to_thread(thief.start)
            await asyncio.to_thread(thief.stop)
            thief.close()

            def registered_again() -> bool:
                stat = anonymous.exists(paths.server("s0"))
                return stat is not None and stat.ephemeralOwner != first

            await until(registered_again, "the registration in a new session")
            stat = anonymous.exists(paths.server("s0"))
            assert same_acl(admin.get_acls(paths.server("s0"))[0], acl)
            with pytest.raises(NoAuthError):
                anonymous.set(paths.server("s0"), b"{}", version=stat.version + 1000)
        finally:
            await coordinator.stop()

    try:
        asyncio.run(scenario())
    finally:
        close(anonymous)
        close(admin)


def test_the_plan_and_the_server_check_are_pure_decisions():
    paths = ClusterPaths.of("/w")
    acl = metadata_acl(ZkCredential("waltz", "pw"))
    client_ids = [make_digest_acl("waltz", "pw", all=True), *acl[1:]]
    nodes = {
        "/w": (acl, 1),
        "/w/ownership": (OPEN_ACL_UNSAFE, 0),
        "/w/cluster": (OPEN_ACL_UNSAFE, 3),
        "/w/client-ids": (acl, 0),
    }
    changes = plan_changes(nodes, paths, acl, client_ids)
    # The cluster node first: servers copy its ACL onto what they create.
    assert [c.path for c in changes] == ["/w/cluster", "/w/ownership"]
    assert changes[0].version == 3 and same_acl(changes[0].after, acl)
    assert plan_changes({p: (acl, 0) for p in nodes}, paths, acl, acl) == []

    writers = {"digest:waltz", "x509:CN=admin"}
    regs = {
        "ok": ServerRegistration("ok", "h", 1, 2, zk_auth=("digest:waltz",)),
        "cert": ServerRegistration("cert", "h", 1, 2, zk_auth=("x509:CN=admin",)),
        "old": ServerRegistration("old", "h", 1, 2),
        "other": ServerRegistration("other", "h", 1, 2, zk_auth=("digest:someone",)),
        "garbled": None,
    }
    assert sorted(servers_not_writers(regs, writers)) == ["garbled", "old", "other"]
    assert "digest:someone" in servers_not_writers(regs, writers)["other"]
    # The registration names a credential by its user only, never its password hash.
    assert session_identities(ZkCredential("waltz", "pw")) == ["digest:waltz"]
    assert ServerRegistration.decode(regs["ok"].encode()) == regs["ok"]
