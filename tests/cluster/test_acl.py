"""ACLs on a cluster's metadata in a real ZooKeeper: with a credential, CreateCluster
lets anyone read, and only the credential write (client IDs included: servers allocate
them)."""

from __future__ import annotations

import pytest
from kazoo.exceptions import NoAuthError
from kazoo.security import Permissions

from waltz_client.cluster.acl import ZkCredential
from waltz_client.cluster.admin import create_cluster, new_client_id, read_params
from waltz_client.cluster.errors import ClusterError
from waltz_client.cluster.paths import ClusterPaths
from waltz_client.cluster.zk import close, connect

STORAGES = ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]


@pytest.fixture
def admin(zookeeper):
    zk = connect(zookeeper.connect_string, credential=ZkCredential("waltz", "s3cret"))
    yield zk
    close(zk)


@pytest.fixture
def anonymous(zookeeper):
    zk = connect(zookeeper.connect_string)
    yield zk
    close(zk)


def test_anyone_reads_only_the_credential_writes(admin, anonymous, zk_root):
    created = create_cluster(admin, zk_root, "acl", 2, 3, STORAGES)
    paths = ClusterPaths.of(zk_root)
    acls, _ = anonymous.get_acls(paths.ownership)
    assert {(a.id.scheme, a.perms) for a in acls} == {
        ("digest", Permissions.ALL),
        ("world", Permissions.READ),
    }
    # Reading needs no credential.
    assert read_params(anonymous, zk_root).key == created.params.key
    # Writing does, drawing a client ID included.
    first, second = new_client_id(admin, zk_root), new_client_id(admin, zk_root)
    assert second > first
    for write in (
        lambda: new_client_id(anonymous, zk_root),
        lambda: anonymous.set(paths.ownership, b"{}"),
        lambda: anonymous.set(paths.partition(0), b"{}"),
        lambda: anonymous.create(paths.server("intruder"), b"", ephemeral=True),
        lambda: anonymous.delete(paths.assignment),
        lambda: anonymous.set(paths.cluster, b"{}"),
    ):
        with pytest.raises(NoAuthError):
            write()
    # The credential can: a node it adds gets the same ACL.
    admin.create(paths.server("server-x"), b"{}", ephemeral=True)
    acls, _ = anonymous.get_acls(paths.server("server-x"))
    assert {a.id.scheme for a in acls} == {"digest", "world"}


def test_a_credential_file_must_hold_user_and_password(tmp_path):
    bad = tmp_path / "auth"
    bad.write_text("no-colon\n")
    with pytest.raises(ClusterError, match="must hold user:password"):
        ZkCredential.from_file(str(bad))
    good = tmp_path / "good"
    good.write_text("waltz:pa:ss\n")
    assert ZkCredential.from_file(str(good)) == ZkCredential("waltz", "pa:ss")
