"""ZooKeeper ACLs on a cluster's metadata, and the credential that may write it.

With a credential (digest scheme, ``user:password``, kept in a file such as a mounted
Secret), CreateCluster writes every node of the cluster with this ACL:

- the credential: every permission;
- anyone: read. Clients and storage nodes only read the metadata;
- anyone, on ``<root>/client-ids`` only: also create and delete children, so that a
  client can allocate its client ID (a sequential node it deletes at once).

Servers and the admin CLI connect with the credential (they write ownership, partition
metadata, registrations and client bindings); nodes they create get the same ACL.
Without a credential, nothing changes: ZooKeeper's open ACL, as before.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from kazoo.security import ACL, OPEN_ACL_UNSAFE, Permissions, make_digest_acl

from .zk import ClusterError

ANYONE = {"scheme": "world", "id": "anyone"}


@dataclass(frozen=True, slots=True)
class ZkCredential:
    user: str
    password: str

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


def metadata_acl(credential: ZkCredential | None) -> list[ACL]:
    """Every node of the cluster: the credential may do anything, anyone may read."""
    if credential is None:
        return list(OPEN_ACL_UNSAFE)
    return [
        make_digest_acl(credential.user, credential.password, all=True),
        world(Permissions.READ),
    ]


def client_ids_acl_of(zk) -> list[ACL] | None:
    """The ``client-ids`` ACL for nodes created by ``zk``: its default ACL (the cluster's,
    from its credential) opened to anyone for allocating IDs; None (kazoo's default)
    when it has none."""
    acl = getattr(zk, "default_acl", None)
    if not acl or list(acl) == list(OPEN_ACL_UNSAFE):
        return None
    owners = [a for a in acl if a.id.scheme != "world"]
    return [*owners, world(Permissions.READ | Permissions.CREATE | Permissions.DELETE)]


def credential_from_setting(path: str, setting: str) -> ZkCredential | None:
    """A daemon's ``zk_auth_file`` setting: None when empty."""
    if not path:
        return None
    if not os.path.exists(path):
        raise ClusterError(f"setting {setting}: {path} does not exist")
    return ZkCredential.from_file(path, setting)
