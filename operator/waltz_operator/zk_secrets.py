"""How the operator itself reaches a cluster's ZooKeeper: with the credential and the
TLS certificate its spec names (``spec.zookeeper.authSecret`` and ``tlsSecret``), read
from the Kubernetes API. Under the operator's own CA (``spec.tls.mode: operator``) with
no ``authSecret``, the credential is one the operator made (``<name>-zookeeper-credential``).

The credential is what CreateCluster writes the metadata's ACL with, and what the
servers write with; the certificate reaches ZooKeeper's TLS port. A TLS Secret with only
``ca.crt`` (the chart's bundled ZooKeeper: server authentication only, the credential
authenticates) verifies ZooKeeper without presenting a certificate. kazoo reads TLS
files, so they are written to a private directory (one per Secret, mode 0600); a
rotated Secret gets new files and, through a new ``ZkAccess``, a new connection.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from waltz_client.cluster.acl import ZkCredential
from waltz_client.cluster.paths import ClusterPaths
from waltz_client.runtime.tls import TlsFiles

from .desired import ZK_AUTH_KEY, _metadata
from .spec import ClusterSpec

TLS_KEYS = ("tls.crt", "tls.key", "ca.crt")
CA_ONLY_KEYS = ("ca.crt",)


class SecretProblem(Exception):
    """A Secret the spec names is missing or unusable; the message says which and why."""


@dataclass(frozen=True)
class ZkAccess:
    credential: ZkCredential | None = None
    tls: TlsFiles | None = None
    tls_digest: str = ""  # changes when the certificate does: a new connection
    # Whether the TLS Secret holds a client certificate (tls.crt, tls.key), not only ca.crt.
    tls_client_certificate: bool = True

    @property
    def connect_arguments(self) -> dict[str, Any]:
        return {"credential": self.credential, "tls": self.tls}


def _data(secret: Mapping[str, Any], key: str, where: str) -> bytes:
    encoded = (secret.get("data") or {}).get(key)
    if not encoded:
        raise SecretProblem(f"{where} has no key {key!r}")
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise SecretProblem(f"{where}: key {key!r} is not base64") from None


def credential_of(secret: Mapping[str, Any], where: str) -> ZkCredential:
    """``user:password`` from the Secret's ``credential`` key."""
    line = _data(secret, ZK_AUTH_KEY, where).decode("utf-8", errors="replace").strip()
    user, sep, password = line.partition(":")
    if not sep or not user or not password:
        raise SecretProblem(f"{where}: key {ZK_AUTH_KEY!r} must hold user:password")
    return ZkCredential(user, password)


def has_client_certificate(secret: Mapping[str, Any]) -> bool:
    """A TLS Secret with tls.crt or tls.key presents a certificate (and needs both);
    one with only ca.crt just verifies the server."""
    data = secret.get("data") or {}
    return bool(data.get("tls.crt") or data.get("tls.key"))


def write_tls_files(secret: Mapping[str, Any], where: str, directory: str) -> tuple[TlsFiles, str]:
    """The Secret's certificate, key and CA (or its CA alone, when it has no client
    certificate) as files in ``directory``, and their digest."""
    keys = TLS_KEYS if has_client_certificate(secret) else CA_ONLY_KEYS
    blobs = {key: _data(secret, key, where) for key in keys}
    digest = hashlib.sha256(b"".join(blobs[k] for k in keys)).hexdigest()[:16]
    os.makedirs(directory, mode=0o700, exist_ok=True)
    paths = {}
    for key, blob in blobs.items():
        path = os.path.join(directory, f"{digest}-{key}")
        if not os.path.exists(path):
            temporary = f"{path}.tmp"
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            os.replace(temporary, path)  # whole files only: kazoo may read them any time
        paths[key] = path
    return TlsFiles(paths.get("tls.crt"), paths.get("tls.key"), paths["ca.crt"]), digest


async def zk_access(
    spec: ClusterSpec,
    get_secret: Callable[[str, str], Awaitable[Mapping[str, Any] | None]],
    directory: str,
    credential: bool = True,
) -> ZkAccess:
    """The operator's way into the cluster's ZooKeeper (nothing special without Secrets);
    without its ``credential`` if asked (to look at the metadata before it exists)."""

    async def secret(name: str, field: str) -> tuple[Mapping[str, Any], str]:
        where = f"Secret {spec.namespace}/{name} ({field})"
        found = await get_secret(spec.namespace, name)
        if found is None:
            raise SecretProblem(f"{where} does not exist")
        return found, where

    found_credential = None
    if credential and spec.zk_credential_secret:
        field = (
            "the ZooKeeper credential the operator made"
            if spec.zk_credential_generated
            else "spec.zookeeper.authSecret"
        )
        found_credential = credential_of(*await secret(spec.zk_credential_secret, field))
    tls, digest, client_certificate = None, "", True
    if spec.zk_tls_secret:
        found, where = await secret(spec.zk_tls_secret, "spec.zookeeper.tlsSecret")
        target = os.path.join(directory, spec.namespace, spec.zk_tls_secret)
        tls, digest = write_tls_files(found, where, target)
        client_certificate = has_client_certificate(found)
    return ZkAccess(found_credential, tls, digest, client_certificate)


# --- the credential the operator makes ------------------------------------------------------

GENERATED_USER = "waltz"


def generated_credential_secret(spec: ClusterSpec) -> dict[str, Any]:
    """A new, random ZooKeeper credential for the cluster (``spec.zookeeper.authSecret``
    not given, TLS from the operator's CA). Not owned by the WaltzCluster: the metadata's
    ACL names it, and the metadata outlives the resource (``retainVolumes``); a WaltzCluster
    made again over retained metadata must find the same credential."""
    password = secrets.token_urlsafe(32)
    meta = _metadata(replace(spec, uid=""), spec.zk_credential_secret, "zookeeper-credential")
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta,
        "type": "Opaque",
        "data": {ZK_AUTH_KEY: base64.b64encode(f"{GENERATED_USER}:{password}".encode()).decode()},
    }


def written_under_a_credential(zk: KazooClient, root: str) -> bool:
    """Whether the cluster's metadata exists with a digest credential in its ACL (blocking).
    Then a new credential could not write it: the old one must be found, not replaced."""
    path = ClusterPaths.of(root).cluster
    try:
        acls, _ = zk.get_acls(path)
    except NoNodeError:
        return False
    return any(acl.id.scheme == "digest" for acl in acls)
