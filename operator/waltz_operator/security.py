"""What the operator does to secure a cluster on its own (``spec.tls.mode: operator``):
keep its CA and certificates (``pki.plan`` decides, this writes), make its ZooKeeper
credential, and keep a running cluster's TLS mode from being switched under it. The
decisions are pure (``settle_mode``, pki.py); the rest reads and writes Secrets.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from waltz_client.cluster.errors import ClusterError
from waltz_client.cluster.zk import close, connect

from . import pki
from .desired import running_tls_mode
from .events import Event
from .kube import ApiError, KubeApi
from .owned import Key, controlled_by
from .spec import SECRETS, ClusterSpec
from .zk_secrets import (
    SecretProblem,
    generated_credential_secret,
    written_under_a_credential,
    zk_access,
)

Live = Mapping[Key, Mapping[str, Any]] | None


# --- the mode -----------------------------------------------------------------------------


class ModeRefused(Exception):
    """The spec's TLS mode cannot be applied, nor the running one kept; nothing is."""


@dataclass(frozen=True)
class ModeDecision:
    spec: ClusterSpec  # with the mode to apply
    record: str | None = None  # write it into spec.tls.mode (it was not given)
    problem: str | None = None  # a switch refused: the status says so


def _with_mode(spec: ClusterSpec, mode: str) -> ClusterSpec:
    return replace(spec, tls=replace(spec.tls, mode=mode, mode_given=True))


def settle_mode(spec: ClusterSpec, statefulset: Mapping[str, Any] | None) -> ModeDecision:
    """The TLS mode to apply. A running cluster keeps the mode its pods were made with:
    switching it would roll servers and storage nodes into two camps that cannot reach
    each other (plain against TLS, or two CAs), and partitions would lose their quorum.
    A resource without ``spec.tls.mode`` (made before it existed, or left to the
    default) gets its mode written: the running one, else the default."""
    running = running_tls_mode(statefulset)
    wanted = spec.tls.mode
    # A mode can be written only with the fields it goes with (the CRD's rule).
    recordable = running is None or (running == SECRETS) == bool(spec.tls.storage_secret)
    if not spec.tls.mode_given and recordable:
        mode = running or wanted
        return ModeDecision(_with_mode(spec, mode), record=mode)
    if running is None or running == wanted:
        return ModeDecision(spec)
    problem = (
        f"spec.tls.mode {wanted} is not the mode the cluster's pods run with ({running}): "
        f"switching a running cluster would split its servers and storage nodes, while "
        f"they roll, into two sides that cannot reach each other; it keeps {running}. "
        f"For {wanted}, create a new cluster and move the clients to it"
    )
    if running == SECRETS and not spec.tls.storage_secret:
        raise ModeRefused(f"{problem}; spec.tls no longer names its Secrets: nothing was applied")
    return ModeDecision(_with_mode(spec, running), problem=problem)


# --- the CA and the certificates --------------------------------------------------------


def _live_secret(live: Live, namespace: str, name: str) -> Mapping[str, Any] | None:
    assert live is not None
    return live.get(("Secret", namespace, name))


async def _read(kube: KubeApi, spec: ClusterSpec, live: Live) -> dict[str, Any]:
    """The cluster's certificate Secrets by name (None: missing), from the watch when
    there is one; refuses to go on over a Secret of the same name that is not ours."""
    names = pki.secret_names(spec)
    if live is None:
        found = {n: await kube.get("Secret", spec.namespace, n) for n in names}
    else:
        found = {n: _live_secret(live, spec.namespace, n) for n in names}
    for name, secret in found.items():
        if secret is not None and not controlled_by(secret, spec.uid):
            raise SecretProblem(
                f"Secret {spec.namespace}/{name} is not this WaltzCluster's: the operator "
                f"keeps the cluster's certificates there (spec.tls.mode operator); nothing "
                f"was applied. Rename or delete it, or use it with spec.tls.mode secrets"
            )
    return found


async def ensure_certificates(
    kube: KubeApi, spec: ClusterSpec, live: Live, now: datetime.datetime
) -> tuple[list[Event], bytes]:
    """Issue what is missing, wrong or due (pki.plan); the Events, and the CA's
    certificate (for checking the daemons' HTTPS)."""
    secrets = await _read(kube, spec, live)
    todo = pki.plan(spec, secrets, now)
    if not todo.empty and live is not None:
        # The watch may not show our own last write yet: look again before writing.
        secrets = await _read(kube, spec, None)
        todo = pki.plan(spec, secrets, now)
    if todo.empty:
        return [], pki.read_authority(secrets[pki.ca_secret(spec)]).cert_pem
    issued = pki.issue(spec, todo, secrets, now)
    for secret in issued.secrets:  # the CA first: a leaf is never newer than its CA
        await kube.apply(secret)
    reason = "CertificateIssued"
    return [Event("Normal", reason, m) for m in issued.messages], issued.authority.cert_pem


async def published_ca(kube: KubeApi, spec: ClusterSpec, live: Live) -> bytes | None:
    """The CA certificate as published (while paused, nothing is issued)."""
    name = pki.ca_cert_secret(spec)
    if live is None:
        secret = await kube.get("Secret", spec.namespace, name)
    else:
        secret = _live_secret(live, spec.namespace, name)
    return pki.published_certificate(secret)


# --- the ZooKeeper credential -------------------------------------------------------------


async def ensure_zk_credential(
    kube: KubeApi,
    spec: ClusterSpec,
    live: Live,
    get_secret: Callable[[str, str], Awaitable[Mapping[str, Any] | None]],
    secret_dir: str,
    zk_timeout: float,
) -> list[Event]:
    """Make the credential when it is missing, unless the cluster's metadata already has
    a credential in its ACL: a new one could not write it, so the old one must be found."""
    ns, name = spec.namespace, spec.zk_credential_secret
    if live is not None and _live_secret(live, ns, name) is not None:
        return []
    if await kube.get("Secret", ns, name) is not None:  # the watch may lag behind
        return []
    access = await zk_access(spec, get_secret, secret_dir, credential=False)

    def check() -> bool:
        zk = connect(spec.zookeeper, zk_timeout, **access.connect_arguments)
        try:
            return written_under_a_credential(zk, spec.zk_root)
        finally:
            close(zk)

    where = f"Secret {ns}/{name} (the ZooKeeper credential the operator made)"
    try:
        written = await asyncio.to_thread(check)
    except ClusterError as e:
        raise SecretProblem(
            f"{where} does not exist, and whether the metadata at {spec.zk_root} needs an "
            f"earlier one cannot be checked: {e}"
        ) from None
    if written:
        raise SecretProblem(
            f"{where} does not exist, but the cluster's metadata at {spec.zk_root} is "
            f"written under a credential's ACL: a new credential could not write it. "
            f"Restore the Secret (key 'credential': user:password), or name the "
            f"credential's Secret in spec.zookeeper.authSecret"
        )
    try:
        await kube.create(generated_credential_secret(spec))
    except ApiError as e:
        if e.status != 409:  # 409: made meanwhile (another reconcile): use that one
            raise
    return [
        Event(
            "Normal",
            "CredentialCreated",
            f"made the ZooKeeper credential in Secret {ns}/{name}: the metadata is "
            f"written under its ACL (anyone reads, only it writes)",
        )
    ]
