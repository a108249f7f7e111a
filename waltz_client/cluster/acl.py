"""ZooKeeper ACLs on a cluster's metadata, and who may write it.

The writers are a credential (digest scheme, ``user:password``, kept in a file such as
a mounted Secret) and/or identities ZooKeeper authenticates itself: the certificate of a
TLS connection (``x509:<subject DN>``) or a SASL principal (``sasl:<name>``). With any
writer, CreateCluster writes every node of the cluster with this ACL:

- each writer: every permission;
- anyone: read, and nothing else, on every node. Clients and storage nodes only read
  the metadata; a client gets its client ID from a server (``client_ids``).

Servers and the admin CLI authenticate as a writer (they write ownership, partition
metadata, registrations, client IDs and their bindings); nodes they create copy the ACL
of the cluster node (``adopt_cluster_acl``), so only CreateCluster needs to know the
writers. Without writers, nothing changes: ZooKeeper's open ACL, as before. (Clusters
created before servers allocated client IDs let anyone create and delete children of
``<root>/client-ids``; they keep working, and ``client_ids_acl_of`` closes it.)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.security import (
    ACL,
    OPEN_ACL_UNSAFE,
    Id,
    Permissions,
    make_digest_acl,
)

from .errors import ClusterError
from .paths import ClusterPaths

# Schemes whose identities ZooKeeper establishes itself (digest writers use a credential).
IDENTITY_SCHEMES = ("x509", "sasl", "digest", "ip")

ANYONE = {"scheme": "world", "id": "anyone"}


@dataclass(frozen=True, slots=True)
class ZkCredential:
    user: str
    password: str = field(repr=False)  # never in a log line

    @classmethod
    def from_file(cls, path: str, setting: str = "zk_auth_file") -> ZkCredential:
        """``user:password`` on the file's first line (ClusterError names the setting)."""
        try:
            with open(path, encoding="utf-8") as f:
                line = f.readline().strip()
        except OSError as e:
            raise ClusterError(f"setting {setting}: cannot read {path}: {e.strerror}") from None
        user, sep, password = line.partition(":")
        if not sep or not user or not password:
            raise ClusterError(
                f"setting {setting}: {path} must hold user:password on its first line"
            )
        return cls(user, password)

    @property
    def auth_data(self) -> list[tuple[str, str]]:
        """For ``KazooClient(auth_data=...)``."""
        return [("digest", f"{self.user}:{self.password}")]


def world(perms: int) -> ACL:
    from kazoo.security import Id

    return ACL(perms, Id(ANYONE["scheme"], ANYONE["id"]))


def metadata_acl(credential: ZkCredential | None, writers: Sequence[Id] = ()) -> list[ACL]:
    """Every node of the cluster: the credential and the writers may do anything, anyone
    may read (without either, ZooKeeper's open ACL)."""
    if credential is None and not writers:
        return list(OPEN_ACL_UNSAFE)
    acl = [ACL(Permissions.ALL, w) for w in writers]
    if credential is not None:
        acl.insert(0, make_digest_acl(credential.user, credential.password, all=True))
    return [*acl, world(Permissions.READ)]


def parse_writer(text: str) -> Id:
    """``x509:CN=waltz-server,O=Example`` -> Id("x509", "CN=waltz-server,O=Example")."""
    scheme, sep, identity = text.partition(":")
    if not sep or not identity or scheme not in IDENTITY_SCHEMES:
        raise ClusterError(
            f"ACL writer {text!r}: expected SCHEME:ID with SCHEME one of "
            f"{', '.join(IDENTITY_SCHEMES)} (e.g. x509:CN=waltz-server,O=Example)"
        )
    return Id(scheme, identity)


def adopt_cluster_acl(zk: KazooClient, root: str) -> None:
    """Nodes ``zk`` creates from now on get the cluster node's ACL (whoever wrote it)."""
    try:
        acl, _ = zk.get_acls(ClusterPaths.of(root).cluster)
    except NoNodeError:
        return
    zk.default_acl = list(acl)


def readopt_open_acl(zk: KazooClient, root: str) -> None:
    """Before creating a node: a session that adopted an open cluster ACL reads the
    cluster node's ACL again, so that a node created after ``waltz cluster secure`` gets
    the new ACL, not the open one read at start. Free once the adopted ACL is not open."""
    acl = getattr(zk, "default_acl", None)
    if not acl or list(acl) == list(OPEN_ACL_UNSAFE):
        adopt_cluster_acl(zk, root)


def acl_writers(acl: Sequence[ACL]) -> set[str]:
    """``scheme:id`` of every identity ``acl`` lets do everything (not ``world``); a
    digest identity as ``digest:<user>``, as ``identities.session_identities`` names it."""
    return {
        principal(f"{a.id.scheme}:{a.id.id}")
        for a in acl
        if a.id.scheme != "world" and a.perms & Permissions.ALL == Permissions.ALL
    }


def principal(text: str) -> str:
    """``scheme:id`` without a digest identity's password hash (``digest:<user>``)."""
    scheme, _, ident = text.partition(":")
    if scheme == "digest":
        return f"digest:{ident.partition(':')[0]}"
    return text


def client_ids_acl_of(zk: KazooClient) -> list[ACL] | None:
    """The ``client-ids`` ACL for nodes created by ``zk``: its default ACL, as every node's
    (servers draw client IDs; anyone else only reads); None (kazoo's default) when it has
    none."""
    acl = getattr(zk, "default_acl", None)
    if not acl or list(acl) == list(OPEN_ACL_UNSAFE):
        return None
    return list(acl)


def credential_from_setting(path: str, setting: str) -> ZkCredential | None:
    """A daemon's ``zk_auth_file`` setting: None when empty."""
    if not path:
        return None
    if not os.path.exists(path):
        raise ClusterError(f"setting {setting}: {path} does not exist")
    return ZkCredential.from_file(path, setting)
