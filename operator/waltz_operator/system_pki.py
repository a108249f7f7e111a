"""The chart's own certificate authority (the "system" PKI), kept by the operator. Pure:
``plan`` says which Secrets are missing, wrong or due for renewal at a given time, and
``issue`` makes the Secrets that plan calls for (system_tls.py reads and writes them).

A WaltzCluster's CA (pki.py) is made with the cluster; the chart's bundled ZooKeeper
and the operator's own HTTPS port exist before any cluster and serve every cluster, so
they get a CA of their own, one per release, in the operator's namespace. With the
prefix the chart passes (``<release>-waltz-system``):

| Secret | type | holds |
| --- | --- | --- |
| ``<prefix>-ca`` | Opaque | ``ca.crt``, ``ca.key``: the CA (only the operator reads it) |
| ``<prefix>-ca-cert`` | Opaque | ``ca.crt`` only: what ZooKeeper's clients verify with |
| ``<prefix>-zookeeper-tls`` | kubernetes.io/tls | the bundled ZooKeeper's server certificate |
| ``<prefix>-operator-tls`` | kubernetes.io/tls | the operator's /metrics and /healthz |

ZooKeeper's PEM key store (``ssl.keyStore.type=PEM``) is one file holding the private
key, in PKCS#8 (``BEGIN PRIVATE KEY``, the only form it reads), and the certificate:
the ZooKeeper Secret carries it as ``keystore.pem`` besides ``tls.crt``/``tls.key``.
Helm's own template functions cannot make such a key, nor keep a CA renewed.

Renewal is pki.py's: a leaf two thirds into its life (90 days) gets a new key and
certificate in the same Secret; the CA certificate two thirds into its ten years is
renewed with the same key, so certificates issued under either verify under both.
"""

from __future__ import annotations

import base64
import datetime
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import pki
from .pki import Authority, Issued, Plan, Profile

COMPONENT = "system-pki"  # app.kubernetes.io/component of its Secrets
MANAGED_BY = "waltz-operator"
KEYSTORE = "keystore.pem"  # ZooKeeper's PEM key store: PKCS#8 key, then certificate
OPERATOR_IDENTITY = "waltz-operator"
ZOOKEEPER_IDENTITY = "zookeeper"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class SystemNames:
    """Where the system PKI lives and what it certifies."""

    prefix: str  # Secrets <prefix>-ca, -ca-cert, -zookeeper-tls, -operator-tls
    namespace: str  # the operator's (the release's)
    operator_service: str = ""  # the operator's Service: its HTTPS certificate ("": none)
    zookeeper: str = ""  # the bundled ZooKeeper's name: its certificate ("": none)

    def __post_init__(self) -> None:
        for what, value, required in (
            ("the system PKI prefix (--system-pki)", self.prefix, True),
            ("the namespace", self.namespace, True),
            ("the operator's Service (--operator-service)", self.operator_service, False),
            ("the bundled ZooKeeper's name (--zookeeper-tls)", self.zookeeper, False),
        ):
            if (value or required) and not _DNS_LABEL.match(value):
                raise ValueError(
                    f"{what} must be a DNS label (lower-case letters, digits and '-', "
                    f"starting and ending with a letter or digit), got {value!r}"
                )
        # Secret names are DNS subdomains of at most 253 characters; the longest suffix:
        if len(self.prefix) + len("-zookeeper-tls") > 253:
            raise ValueError(f"the system PKI prefix is too long: {self.prefix!r}")

    @property
    def ca_secret(self) -> str:
        return f"{self.prefix}-ca"

    @property
    def ca_cert_secret(self) -> str:
        return f"{self.prefix}-ca-cert"

    @property
    def zookeeper_secret(self) -> str:
        return f"{self.prefix}-zookeeper-tls"

    @property
    def operator_secret(self) -> str:
        return f"{self.prefix}-operator-tls"


def zookeeper_dns_names(names: SystemNames) -> tuple[str, ...]:
    """What clients dial (charts/waltz/templates/zookeeper.yaml): each pod by its name under
    the headless Service, ``<zk>-<i>.<zk>-headless.<ns>.svc`` (the wildcard covers every
    ordinal, so scaling the ensemble needs no new certificate), and the client Service."""
    zk, ns = names.zookeeper, names.namespace
    return (
        f"*.{zk}-headless.{ns}.svc",
        f"*.{zk}-headless.{ns}.svc.cluster.local",
        f"{zk}.{ns}.svc",
        f"{zk}.{ns}.svc.cluster.local",
    )


def operator_dns_names(names: SystemNames) -> tuple[str, ...]:
    svc, ns = names.operator_service, names.namespace
    return (svc, f"{svc}.{ns}", f"{svc}.{ns}.svc", f"{svc}.{ns}.svc.cluster.local")


def profiles(names: SystemNames) -> tuple[Profile, ...]:
    """Server certificates only: ZooKeeper authenticates its clients by their digest
    credential (``ssl.clientAuth=none``), and nothing dials out with these."""
    out = []
    if names.zookeeper:
        out.append(
            Profile(
                names.zookeeper_secret,
                ZOOKEEPER_IDENTITY,
                zookeeper_dns_names(names),
                server=True,
                client=False,
            )
        )
    if names.operator_service:
        out.append(
            Profile(
                names.operator_secret,
                OPERATOR_IDENTITY,
                operator_dns_names(names),
                server=True,
                client=False,
            )
        )
    return tuple(out)


def secret_names(names: SystemNames) -> tuple[str, ...]:
    return (names.ca_secret, names.ca_cert_secret, *(p.secret for p in profiles(names)))


def _data(secret: Mapping[str, Any], key: str) -> bytes | None:
    encoded = (secret.get("data") or {}).get(key)
    try:
        return base64.b64decode(encoded, validate=True) if encoded else None
    except ValueError:
        return None


def leaf_problem(
    profile: Profile,
    secret: Mapping[str, Any] | None,
    authority: Authority,
    now: datetime.datetime,
) -> str | None:
    """pki.leaf_problem, and for ZooKeeper its key store: exactly tls.key then tls.crt."""
    problem = pki.leaf_problem(profile, secret, authority, now)
    if problem is not None or profile.common_name != ZOOKEEPER_IDENTITY:
        return problem
    assert secret is not None
    key, cert = _data(secret, "tls.key"), _data(secret, "tls.crt")
    if _data(secret, KEYSTORE) != (key or b"") + (cert or b""):
        return f"its {KEYSTORE!r} is not its tls.key and tls.crt"
    if not (key or b"").startswith(b"-----BEGIN PRIVATE KEY-----"):
        return "its tls.key is not PKCS#8 (ZooKeeper's PEM key store reads no other form)"
    return None


def plan(
    names: SystemNames, secrets: Mapping[str, Mapping[str, Any] | None], now: datetime.datetime
) -> Plan:
    """What to write, given the Secrets by name as they are now (None: missing)."""
    return pki.plan_secrets(
        names.ca_secret, names.ca_cert_secret, profiles(names), secrets, now, leaf_problem
    )


# --- issuing ------------------------------------------------------------------------------


def ca_common_name(names: SystemNames) -> str:
    return f"waltz system CA {names.namespace}/{names.prefix}"


def labels(names: SystemNames) -> dict[str, str]:
    return {
        "app.kubernetes.io/part-of": "waltz",
        "app.kubernetes.io/component": COMPONENT,
        "app.kubernetes.io/instance": names.prefix,
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def is_ours(secret: Mapping[str, Any], names: SystemNames) -> bool:
    """Whether a Secret of one of our names was made by the system PKI (else it is left
    alone: it is someone else's)."""
    found = (secret.get("metadata") or {}).get("labels") or {}
    return all(found.get(k) == v for k, v in labels(names).items())


def _secret(
    names: SystemNames, name: str, data: Mapping[str, bytes], kind: str = "Opaque"
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": names.namespace, "labels": labels(names)},
        "type": kind,
        "data": {k: base64.b64encode(v).decode() for k, v in sorted(data.items())},
    }


def leaf_secret(
    names: SystemNames, profile: Profile, authority: Authority, now: datetime.datetime
) -> dict[str, Any]:
    key = pki.new_key()
    cert = pki.leaf_certificate(profile, key, authority, now)
    cert_pem, key_pem = pki._pem(cert), pki.key_pem(key)
    data = {"tls.crt": cert_pem, "tls.key": key_pem, "ca.crt": authority.cert_pem}
    if profile.common_name == ZOOKEEPER_IDENTITY:
        data[KEYSTORE] = key_pem + cert_pem
    return _secret(names, profile.secret, data, pki.TLS_TYPE)


def issue(
    names: SystemNames,
    todo: Plan,
    secrets: Mapping[str, Mapping[str, Any] | None],
    now: datetime.datetime,
) -> Issued:
    """The Secrets ``todo`` calls for, the CA's first."""
    return pki.issue_with(
        todo,
        secrets.get(names.ca_secret),
        now,
        ca_label=f"system CA {names.ca_secret}",
        ca_common_name=ca_common_name(names),
        authority_secret=lambda authority: _secret(
            names,
            names.ca_secret,
            {"ca.crt": authority.cert_pem, "ca.key": pki.key_pem(authority.key)},
        ),
        ca_cert_secret=lambda pem: _secret(names, names.ca_cert_secret, {"ca.crt": pem}),
        leaf_secret=lambda profile, authority: leaf_secret(names, profile, authority, now),
    )
