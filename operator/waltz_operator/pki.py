"""The cluster's own certificate authority (``spec.tls.mode: operator``). Pure: ``plan``
says which Secrets are missing, wrong or due for renewal at a given time, and ``issue``
makes the Secrets that plan calls for (new keys are random; nothing else is read or
written here: reconcile.py reads the Secrets and applies what comes back).

Every Secret is named after the WaltzCluster ``<name>`` and owned by it:

| Secret | type | holds |
| --- | --- | --- |
| ``<name>-ca`` | Opaque | ``ca.crt``, ``ca.key``: the cluster's CA |
| ``<name>-ca-cert`` | Opaque | ``ca.crt`` only: for scrapers and clients that verify |
| ``<name>-storage-tls`` | kubernetes.io/tls | storage pods (``waltz-storage``) |
| ``<name>-server-tls`` | kubernetes.io/tls | servers (``waltz-server``) |
| ``<name>-client-tls`` | kubernetes.io/tls | applications (``waltz-client``) |
| ``<name>-admin-tls`` | kubernetes.io/tls | admin tools (``waltz-admin``, let into storage) |

Keys are made here and written only to these Secrets. A leaf certificate is renewed (a
new key, a new certificate, in the same Secret) once two thirds of its life have passed,
or at once when it is missing, unreadable, names the wrong identity, or is not the
current CA's. The CA certificate is renewed the same way but keeps its key and subject:
leaves issued under the old CA certificate verify under the new one and the other way
round, so pods that have not yet seen the renewed files keep talking to those that
have. Only a lost or unreadable CA is replaced by a new key, which reissues every leaf.
"""

from __future__ import annotations

import base64
import binascii
import datetime
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .desired import _metadata
from .spec import ClusterSpec

Manifest = dict[str, Any]

LEAF_LIFETIME = datetime.timedelta(days=90)
CA_LIFETIME = datetime.timedelta(days=3650)
RENEW_AT = 2 / 3  # of a certificate's life
# Certificates start a little in the past: a pod whose clock is behind the operator's
# must not find them not yet valid.
BACKDATE = datetime.timedelta(minutes=5)

TLS_TYPE = "kubernetes.io/tls"
COMPONENT = "certificates"  # their app.kubernetes.io/component label


@dataclass(frozen=True)
class Profile:
    """A leaf certificate the cluster needs: the Secret it lives in and its names."""

    secret: str
    common_name: str
    dns_names: tuple[str, ...] = ()
    server: bool = False  # serverAuth: it serves TLS
    client: bool = True  # clientAuth: it dials with it


def ca_secret(spec: ClusterSpec) -> str:
    return f"{spec.name}-ca"


def ca_cert_secret(spec: ClusterSpec) -> str:
    return f"{spec.name}-ca-cert"


def client_secret(spec: ClusterSpec) -> str:
    return f"{spec.name}-client-tls"


def admin_secret(spec: ClusterSpec) -> str:
    return f"{spec.name}-admin-tls"


STORAGE_IDENTITY = "waltz-storage"
SERVER_IDENTITY = "waltz-server"
CLIENT_IDENTITY = "waltz-client"
ADMIN_IDENTITY = "waltz-admin"


def profiles(spec: ClusterSpec) -> tuple[Profile, ...]:
    """The names each certificate must carry are the names its holder is checked for:
    servers dial a storage pod at ``<pod>.<name>-storage.<ns>.svc`` (the wildcard covers
    every ordinal); clients check a server for the client Service's name
    ``<name>.<ns>.svc`` (the operator sets it as the servers' advertised TLS name);
    storage nodes let in the server and admin identities (``tls_allowed_peers``)."""
    ns, storage = spec.namespace, spec.storage_service
    return (
        Profile(
            spec.storage_tls_secret,
            STORAGE_IDENTITY,
            (f"*.{storage}.{ns}.svc", f"*.{storage}.{ns}.svc.cluster.local"),
            server=True,
        ),
        Profile(
            spec.server_tls_secret,
            SERVER_IDENTITY,
            (spec.name, f"{spec.name}.{ns}.svc", f"{spec.name}.{ns}.svc.cluster.local"),
            server=True,
        ),
        Profile(client_secret(spec), CLIENT_IDENTITY),
        Profile(admin_secret(spec), ADMIN_IDENTITY),
    )


def secret_names(spec: ClusterSpec) -> tuple[str, ...]:
    return (ca_secret(spec), ca_cert_secret(spec), *(p.secret for p in profiles(spec)))


# --- reading ------------------------------------------------------------------------------


class Unreadable(ValueError):
    """A Secret's certificate or key cannot be used; the message says why."""


def _blob(secret: Mapping[str, Any], key: str) -> bytes:
    encoded = (secret.get("data") or {}).get(key)
    if not encoded:
        raise Unreadable(f"it has no {key!r}")
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise Unreadable(f"its {key!r} is not base64") from None


def _certificate(secret: Mapping[str, Any], key: str) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(_blob(secret, key))
    except ValueError as e:
        if isinstance(e, Unreadable):
            raise
        raise Unreadable(f"its {key!r} is not a PEM certificate") from None


def _private_key(secret: Mapping[str, Any], key: str) -> Any:
    try:
        return serialization.load_pem_private_key(_blob(secret, key), password=None)
    except (ValueError, TypeError) as e:
        if isinstance(e, Unreadable):
            raise
        raise Unreadable(f"its {key!r} is not an unencrypted PEM private key") from None


def _public(key: Any) -> bytes:
    return key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


@dataclass(frozen=True)
class Authority:
    cert: x509.Certificate
    key: Any  # a private key

    @property
    def cert_pem(self) -> bytes:
        return _pem(self.cert)


def read_authority(secret: Mapping[str, Any]) -> Authority:
    """The CA in a ``<name>-ca`` Secret (``Unreadable`` if it cannot sign)."""
    cert, key = _certificate(secret, "ca.crt"), _private_key(secret, "ca.key")
    if _public(key.public_key()) != _public(cert.public_key()):
        raise Unreadable("its ca.key is not the key of its ca.crt")
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        raise Unreadable("its ca.crt is not a CA certificate")
    return Authority(cert, key)


def published_certificate(secret: Mapping[str, Any] | None) -> bytes | None:
    """The CA certificate a ``<name>-ca-cert`` Secret holds (None: none readable)."""
    try:
        return _blob(secret or {}, "ca.crt")
    except Unreadable:
        return None


def renewal_time(cert: x509.Certificate) -> datetime.datetime:
    """When it is renewed: two thirds into its life."""
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return start + (end - start) * RENEW_AT


def _names(cert: x509.Certificate) -> tuple[str, tuple[str, ...]]:
    common = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns = tuple(san.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        dns = ()
    return (str(common[0].value) if common else "", dns)


def _stamp(when: datetime.datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def leaf_problem(
    profile: Profile,
    secret: Mapping[str, Any] | None,
    authority: Authority,
    now: datetime.datetime,
) -> str | None:
    """Why the Secret must be written again (None: it is as it should be)."""
    if secret is None:
        return "missing"
    try:
        cert = _certificate(secret, "tls.crt")
        key = _private_key(secret, "tls.key")
        ca = _blob(secret, "ca.crt")
    except Unreadable as e:
        return str(e)
    if _public(key.public_key()) != _public(cert.public_key()):
        return "its tls.key is not the key of its tls.crt"
    if ca != authority.cert_pem:
        return "its ca.crt is not the cluster CA's current certificate"
    try:
        cert.verify_directly_issued_by(authority.cert)
    except (ValueError, TypeError, InvalidSignature):
        return "its certificate is not the cluster CA's"
    if _names(cert) != (profile.common_name, profile.dns_names):
        return f"it names {_names(cert)}, not {(profile.common_name, profile.dns_names)}"
    if now >= renewal_time(cert):
        return f"it expires at {_stamp(cert.not_valid_after_utc)}: renewed two thirds into its life"
    return None


# --- the plan -----------------------------------------------------------------------------

CREATE, RENEW = "create", "renew"


@dataclass(frozen=True)
class Plan:
    authority: str | None = None  # CREATE a new CA, RENEW its certificate, or keep it
    authority_reason: str = ""
    publish: bool = False  # write <name>-ca-cert
    leaves: tuple[tuple[Profile, str], ...] = ()  # to issue, with why

    @property
    def empty(self) -> bool:
        return self.authority is None and not self.publish and not self.leaves


def plan(
    spec: ClusterSpec, secrets: Mapping[str, Mapping[str, Any] | None], now: datetime.datetime
) -> Plan:
    """What to write, given the Secrets by name as they are now (None: missing)."""
    return plan_secrets(ca_secret(spec), ca_cert_secret(spec), profiles(spec), secrets, now)


LeafCheck = Callable[[Profile, Mapping[str, Any] | None, Authority, datetime.datetime], str | None]


def plan_secrets(
    ca_name: str,
    ca_cert_name: str,
    leaf_profiles: tuple[Profile, ...],
    secrets: Mapping[str, Mapping[str, Any] | None],
    now: datetime.datetime,
    check: LeafCheck = leaf_problem,
) -> Plan:
    """``plan`` for any CA Secret, published CA certificate and leaves (the operator's
    own system PKI uses it too); ``check`` says why a leaf must be issued again."""
    found = secrets.get(ca_name)
    action, reason, authority = None, "", None
    if found is None:
        action, reason = CREATE, "missing"
    else:
        try:
            authority = read_authority(found)
        except Unreadable as e:
            action, reason = CREATE, str(e)
        else:
            if now >= renewal_time(authority.cert):
                action = RENEW
                reason = f"it expires at {_stamp(authority.cert.not_valid_after_utc)}"
    if action is not None:  # every leaf is issued again, with the new CA certificate
        return Plan(
            action,
            reason,
            publish=True,
            leaves=tuple((p, f"the CA was {action}d") for p in leaf_profiles),
        )
    assert authority is not None
    published = secrets.get(ca_cert_name)
    publish = published is None or (published.get("data") or {}).get("ca.crt") != _b64(
        authority.cert_pem
    )
    leaves = []
    for profile in leaf_profiles:
        problem = check(profile, secrets.get(profile.secret), authority, now)
        if problem is not None:
            leaves.append((profile, problem))
    return Plan(publish=publish, leaves=tuple(leaves))


# --- issuing ------------------------------------------------------------------------------


def _b64(blob: bytes) -> str:
    return base64.b64encode(blob).decode()


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: Any) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def ca_common_name(spec: ClusterSpec) -> str:
    return f"waltz CA {spec.namespace}/{spec.name}"


def ca_certificate(
    key: Any, common_name: str, now: datetime.datetime, lifetime: datetime.timedelta = CA_LIFETIME
) -> x509.Certificate:
    """A self-signed CA certificate (renewing one: the same key and name, a new life)."""
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "waltz"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + lifetime)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


def leaf_certificate(
    profile: Profile,
    key: Any,
    authority: Authority,
    now: datetime.datetime,
    lifetime: datetime.timedelta = LEAF_LIFETIME,
) -> x509.Certificate:
    """A certificate for ``profile`` signed by the CA; it never outlives the CA's."""
    usages = [
        *([ExtendedKeyUsageOID.SERVER_AUTH] if profile.server else []),
        *([ExtendedKeyUsageOID.CLIENT_AUTH] if profile.client else []),
    ]
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, profile.common_name)]))
        .issuer_name(authority.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(min(now + lifetime, authority.cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(authority.cert.public_key()),
            critical=False,
        )
    )
    if profile.dns_names:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(n) for n in profile.dns_names]),
            critical=False,
        )
    return builder.sign(authority.key, hashes.SHA256())


def _secret(
    spec: ClusterSpec, name: str, data: Mapping[str, bytes], kind: str = "Opaque"
) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(spec, name, COMPONENT),
        "type": kind,
        "data": {k: _b64(v) for k, v in sorted(data.items())},
    }


def leaf_secret(
    spec: ClusterSpec,
    profile: Profile,
    authority: Authority,
    now: datetime.datetime,
    lifetime: datetime.timedelta = LEAF_LIFETIME,
) -> Manifest:
    key = new_key()
    cert = leaf_certificate(profile, key, authority, now, lifetime)
    return _secret(
        spec,
        profile.secret,
        {"tls.crt": _pem(cert), "tls.key": key_pem(key), "ca.crt": authority.cert_pem},
        TLS_TYPE,
    )


def authority_secret(spec: ClusterSpec, authority: Authority) -> Manifest:
    return _secret(
        spec, ca_secret(spec), {"ca.crt": authority.cert_pem, "ca.key": key_pem(authority.key)}
    )


@dataclass(frozen=True)
class Issued:
    secrets: tuple[Manifest, ...]  # to apply, the CA's first
    authority: Authority
    messages: tuple[str, ...]  # what was written and why, for Events (no key material)


def issue(
    spec: ClusterSpec,
    todo: Plan,
    secrets: Mapping[str, Mapping[str, Any] | None],
    now: datetime.datetime,
) -> Issued:
    """The Secrets ``todo`` calls for."""
    return issue_with(
        todo,
        secrets.get(ca_secret(spec)),
        now,
        ca_label=f"CA {ca_secret(spec)}",
        ca_common_name=ca_common_name(spec),
        authority_secret=lambda authority: authority_secret(spec, authority),
        ca_cert_secret=lambda pem: _secret(spec, ca_cert_secret(spec), {"ca.crt": pem}),
        leaf_secret=lambda profile, authority: leaf_secret(spec, profile, authority, now),
    )


def issue_with(
    todo: Plan,
    ca: Mapping[str, Any] | None,
    now: datetime.datetime,
    *,
    ca_label: str,
    ca_common_name: str,
    authority_secret: Callable[[Authority], Manifest],
    ca_cert_secret: Callable[[bytes], Manifest],
    leaf_secret: Callable[[Profile, Authority], Manifest],
) -> Issued:
    """The Secrets ``todo`` calls for, the CA's first, with a message for each: what a
    cluster's CA and the chart's system CA share; the Secrets are the caller's."""
    out: list[Manifest] = []
    messages: list[str] = []
    if todo.authority == CREATE:
        key = new_key()
        authority = Authority(ca_certificate(key, ca_common_name, now), key)
    else:
        authority = read_authority(ca or {})
        if todo.authority == RENEW:
            renewed = ca_certificate(authority.key, ca_common_name, now)
            authority = Authority(renewed, authority.key)
    if todo.authority is not None:
        out.append(authority_secret(authority))
        verb = "created" if todo.authority == CREATE else "renewed (same key)"
        messages.append(
            f"{ca_label} {verb} ({todo.authority_reason}); valid until "
            f"{_stamp(authority.cert.not_valid_after_utc)}"
        )
    if todo.publish:
        out.append(ca_cert_secret(authority.cert_pem))
    for profile, why in todo.leaves:
        secret = leaf_secret(profile, authority)
        out.append(secret)
        cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
        messages.append(
            f"certificate {profile.secret} ({profile.common_name}) issued ({why}); valid "
            f"until {_stamp(cert.not_valid_after_utc)}"
        )
    return Issued(tuple(out), authority, tuple(messages))
