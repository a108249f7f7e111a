"""Client IDs a stranger cannot squat (issue 39, rows 1 and 4): the pure decisions
(which ID to allocate, the quota, expiry, what a connection may use), then the
ZooKeeper operations on a real ZooKeeper: allocation binds atomically and skips IDs
bound ahead, the quota holds under concurrent allocations, releases are versioned,
and a cluster's ACL lets nobody without the credential create anything."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kazoo.exceptions import NoAuthError
from kazoo.security import Permissions

from waltz_client.cluster.acl import ZkCredential, client_ids_acl_of, metadata_acl, world
from waltz_client.cluster.admin import create_cluster
from waltz_client.cluster.client_ids import (
    MAX_CLIENT_ID,
    ClientIdRefused,
    allocate_client_id,
    binding_expired,
    binding_refusal,
    draw_size,
    identity_key,
    live_client_ids,
    maintenance_interval,
    new_client_ids,
    pick_client_id,
    quota_refusal,
    read_binding,
    release_unused_bindings,
    touch_binding,
    touch_due,
)
from waltz_client.cluster.paths import ClusterPaths
from waltz_client.cluster.secure import secure_cluster
from waltz_client.cluster.zk import close, connect

STORAGES = ["127.0.0.1:7001"]
ALICE = "CN=alice,O=Example"
MALLORY = "CN=mallory,O=Example"

# --- pure decisions ---------------------------------------------------------------------------


@given(
    st.lists(st.integers(-5, 200), max_size=30).map(sorted),
    st.sets(st.integers(0, 200), max_size=60),
)
def test_the_id_picked_is_the_first_fresh_unbound_one(candidates, bound):
    picked = pick_client_id(candidates, bound)
    fitting = [c for c in candidates if 0 <= c <= MAX_CLIENT_ID and c not in bound]
    assert picked == (fitting[0] if fitting else None)


def test_ids_outside_a_reqid_are_never_picked():
    assert pick_client_id([-3, MAX_CLIENT_ID + 1], set()) is None
    assert pick_client_id([MAX_CLIENT_ID], set()) == MAX_CLIENT_ID


def test_a_draw_reaches_past_the_run_of_bound_ids():
    assert draw_size(9, set()) == 1
    assert draw_size(9, {10, 11, 12, 14}) == 4  # 10..12 bound: the 4th number is free
    assert draw_size(0, set(range(1, 5000)), limit=1000) == 1000


def test_the_quota_counts_live_ids():
    assert quota_refusal(ALICE, 4, 5) is None
    assert quota_refusal(ALICE, 5, 5) == (
        "identity 'CN=alice,O=Example' holds 5 client IDs, its quota (client_id_quota 5); "
        "IDs unused for client_id_retention are released"
    )


def test_an_id_may_be_used_only_by_the_identity_it_was_allocated_to():
    assert binding_refusal(7, ALICE, ALICE) is None
    assert binding_refusal(7, MALLORY, ALICE) == "client ID 7 belongs to another identity"
    assert binding_refusal(7, MALLORY, None) == (
        "client ID 7 was not allocated to identity 'CN=mallory,O=Example'; allocate one "
        "with AllocateClientId (WaltzClient does)"
    )


def test_expiry_and_touches_follow_the_retention():
    assert not binding_expired(100.0, 150.0, 60.0)
    assert binding_expired(100.0, 160.5, 60.0)
    assert maintenance_interval(8.0) == 2.0
    assert maintenance_interval(7 * 86400.0) == 3600.0  # at most hourly
    assert touch_due(None, 0.0, 8.0)
    assert not touch_due(100.0, 101.0, 8.0)
    assert touch_due(100.0, 102.0, 8.0)


def test_identity_keys_are_znode_names():
    key = identity_key("CN=a/b,O=c=d")
    assert "/" not in key and len(key) == 64 and key != identity_key("CN=a/b,O=c=e")


# --- on a real ZooKeeper ----------------------------------------------------------------------

CREDENTIAL = ZkCredential("waltz", "s3cret")


@pytest.fixture
def admin(zookeeper):
    zk = connect(zookeeper.connect_string, credential=CREDENTIAL)
    yield zk
    close(zk)


@pytest.fixture
def anonymous(zookeeper):
    zk = connect(zookeeper.connect_string)
    yield zk
    close(zk)


def test_allocation_binds_atomically_and_counts_against_the_quota(admin, zk_root):
    create_cluster(admin, zk_root, "ids", 1, 1, STORAGES)
    paths = ClusterPaths.of(zk_root)
    ids = [allocate_client_id(admin, zk_root, ALICE, 3) for _ in range(3)]
    assert ids == sorted(set(ids))
    for client_id in ids:
        identity, _ = read_binding(admin, zk_root, client_id)
        assert identity == ALICE
    assert live_client_ids(admin, zk_root, ALICE) == ids
    with pytest.raises(ClientIdRefused, match="holds 3 client IDs, its quota"):
        allocate_client_id(admin, zk_root, ALICE, 3)
    # Another identity has its own quota; a client without an identity binds nothing.
    assert allocate_client_id(admin, zk_root, MALLORY, 3) > ids[-1]
    plain = allocate_client_id(admin, zk_root, None, 3)
    assert read_binding(admin, zk_root, plain) is None
    assert admin.get_children(paths.client_ids) == []  # no sequential node left behind


def test_ids_bound_ahead_are_skipped_not_taken_over(admin, zk_root):
    """An older build bound an ID to whoever used it first: a stranger could bind the next
    IDs ahead. Allocation skips them, in a few round trips, and never rebinds one."""
    create_cluster(admin, zk_root, "ahead", 1, 1, STORAGES)
    paths = ClusterPaths.of(zk_root)
    nxt = new_client_ids(admin, zk_root)[0] + 1
    squatted = range(nxt, nxt + 300)
    admin.ensure_path(paths.client_bindings)
    txn = admin.transaction()
    for client_id in squatted:
        txn.create(paths.client_binding(client_id), MALLORY.encode())
    assert not any(isinstance(r, Exception) for r in txn.commit())
    started = time.monotonic()
    got = allocate_client_id(admin, zk_root, ALICE, 10)
    took = time.monotonic() - started
    assert got not in squatted and got > nxt
    assert read_binding(admin, zk_root, got)[0] == ALICE
    assert all(read_binding(admin, zk_root, c)[0] == MALLORY for c in (nxt, nxt + 299))
    assert took < 30, f"skipping 300 bound IDs took {took:.1f} s"


def test_the_quota_holds_under_concurrent_allocations(admin, zookeeper, zk_root):
    """Eight sessions (as eight servers) allocate for one identity until refused: exactly
    the quota is given (without the versioned rewrite of the identity's node, 11-13 of 10
    were)."""
    create_cluster(admin, zk_root, "race", 1, 1, STORAGES)
    quota = 10
    sessions = [connect(zookeeper.connect_string, credential=CREDENTIAL) for _ in range(8)]
    barrier = threading.Barrier(len(sessions))
    got: list[int] = []
    refused: list[str] = []

    def allocate(zk) -> None:
        barrier.wait()
        while True:
            try:
                got.append(allocate_client_id(zk, zk_root, ALICE, quota))
            except ClientIdRefused as e:
                refused.append(str(e))
                return

    threads = [threading.Thread(target=allocate, args=(zk,)) for zk in sessions]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        for zk in sessions:
            close(zk)
    assert len(got) == quota and len(set(got)) == quota
    assert len(refused) == len(sessions)
    assert live_client_ids(admin, zk_root, ALICE) == sorted(got)


def test_unused_bindings_are_released_and_a_touch_keeps_one(admin, zk_root):
    create_cluster(admin, zk_root, "release", 1, 1, STORAGES)
    paths = ClusterPaths.of(zk_root)
    old, used, kept = (allocate_client_id(admin, zk_root, ALICE, 10) for _ in range(3))
    # A binding from before quotas (no identity entry) is released as well.
    legacy = new_client_ids(admin, zk_root)[0]
    admin.create(paths.client_binding(legacy), MALLORY.encode())
    time.sleep(1.5)
    assert touch_binding(admin, zk_root, used, ALICE)
    assert not touch_binding(admin, zk_root, used, MALLORY)  # not its binding
    released = release_unused_bindings(admin, zk_root, 1.0, time.time(), keep={kept})
    assert sorted(released) == sorted([old, legacy])
    assert read_binding(admin, zk_root, old) is None
    assert read_binding(admin, zk_root, legacy) is None
    assert live_client_ids(admin, zk_root, ALICE) == sorted([used, kept])
    assert not touch_binding(admin, zk_root, old, ALICE)  # gone: its user must allocate
    # Idempotent: nothing more to release now.
    assert release_unused_bindings(admin, zk_root, 1.0, time.time(), keep={kept}) == []
    # The last ID of an identity released: its quota node goes too.
    release_unused_bindings(admin, zk_root, 0.0, time.time() + 10)
    assert admin.get_children(paths.client_identities) == []


def test_nobody_without_the_credential_creates_anything_under_the_cluster(
    admin, anonymous, zk_root
):
    create_cluster(admin, zk_root, "closed", 1, 1, STORAGES)
    allocate_client_id(admin, zk_root, ALICE, 10)  # client-bindings, client-identities too
    paths = ClusterPaths.of(zk_root)
    nodes = [paths.root]
    i = 0
    while i < len(nodes):
        nodes += [f"{nodes[i]}/{c}" for c in admin.get_children(nodes[i])]
        i += 1
    assert paths.client_ids in nodes and paths.client_identities in nodes
    for node in nodes:
        acl, _ = anonymous.get_acls(node)
        assert [a.perms for a in acl if a.id.scheme == "world"] == [Permissions.READ], node
        with pytest.raises(NoAuthError):
            anonymous.create(f"{node}/blob", b"x" * 1000)
    with pytest.raises(NoAuthError):
        anonymous.create(f"{paths.client_ids}/id-", b"x" * 1000, sequence=True)


def test_a_cluster_made_with_an_open_client_ids_node_keeps_working(admin, anonymous, zk_root):
    """Created by an older build: anyone may create children of client-ids. Its IDs keep
    coming from the same counter, and servers allocate on it as on a new cluster."""
    create_cluster(admin, zk_root, "old", 1, 1, STORAGES)
    paths = ClusterPaths.of(zk_root)
    owners = [a for a in metadata_acl(CREDENTIAL) if a.id.scheme != "world"]
    open_acl = [*owners, world(Permissions.READ | Permissions.CREATE | Permissions.DELETE)]
    admin.set_acls(paths.client_ids, open_acl)
    drawn = new_client_ids(anonymous, zk_root)[0]  # an old client draws its own
    assert allocate_client_id(admin, zk_root, ALICE, 10) > drawn
    # `waltz cluster secure` (what it computes for client-ids) closes it.
    admin.default_acl = metadata_acl(CREDENTIAL)
    secure_cluster(admin, zk_root, metadata_acl(CREDENTIAL), client_ids_acl_of(admin), settle=0)
    with pytest.raises(NoAuthError):
        new_client_ids(anonymous, zk_root)
    assert allocate_client_id(admin, zk_root, ALICE, 10) > drawn
