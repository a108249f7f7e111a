"""The ZooKeeper identities of a session: what an x509 certificate is called in an ACL,
and what a daemon publishes in its registration. Apart from ``acl`` because reading a
certificate takes ``cryptography``, which the client (reaching ZooKeeper through ``zk``
and ``acl``) must not need."""

from __future__ import annotations

from cryptography import x509
from cryptography.x509.oid import NameOID
from kazoo.security import Id

from .acl import ZkCredential
from .errors import ClusterError


def x509_writer(cert_path: str) -> Id:
    """The ``x509`` identity ZooKeeper gives a TLS client presenting this certificate: its
    subject DN as Java's X500Principal prints it (RFC 2253, every special escaped)."""
    try:
        with open(cert_path, "rb") as f:
            cert = x509.load_pem_x509_certificate(f.read())
    except (OSError, ValueError) as e:
        raise ClusterError(f"cannot read the certificate {cert_path}: {e}") from None
    keywords = {
        NameOID.COMMON_NAME: "CN",
        NameOID.COUNTRY_NAME: "C",
        NameOID.LOCALITY_NAME: "L",
        NameOID.STATE_OR_PROVINCE_NAME: "ST",
        NameOID.ORGANIZATION_NAME: "O",
        NameOID.ORGANIZATIONAL_UNIT_NAME: "OU",
        NameOID.STREET_ADDRESS: "STREET",
        NameOID.DOMAIN_COMPONENT: "DC",
        NameOID.USER_ID: "UID",
    }
    rdns = []
    for rdn in reversed(list(cert.subject.rdns)):  # RFC 2253: the most specific first
        parts = []
        for attribute in rdn:
            keyword = keywords.get(attribute.oid)
            if keyword is None:
                raise ClusterError(
                    f"{cert_path}: the subject has {attribute.oid.dotted_string}, which "
                    f"ZooKeeper prints in hex; give the identity as x509:DN instead"
                )
            parts.append(f"{keyword}={_escape_2253(str(attribute.value))}")
        rdns.append("+".join(parts))
    return Id("x509", ",".join(rdns))


def _escape_2253(value: str) -> str:
    out = "".join("\\" + c if c in ',=+<>#;"\\' else c for c in value)
    if out.startswith(" "):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out


def session_identities(credential: ZkCredential | None, zk_tls_cert: str = "") -> list[str]:
    """The ZooKeeper identities (``scheme:id``, as an ACL names them) of a session with
    this credential and, over TLS, this certificate. A server publishes them in its
    registration, so that ``waltz cluster secure`` can check that every live server is
    one of the new ACL's writers before it changes anything. A credential is named by its
    user only (``digest:<user>``): its password hash would let anyone who reads the
    registration guess the password offline (ZooKeeper shows it only to an ACL's admins)."""
    ids = []
    if credential is not None:
        ids.append(f"digest:{credential.user}")
    if zk_tls_cert:
        try:
            writer = x509_writer(zk_tls_cert)
        except ClusterError:  # a subject ZooKeeper prints in hex: not matched by name
            pass
        else:
            ids.append(f"{writer.scheme}:{writer.id}")
    return ids
