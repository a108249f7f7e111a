"""Certificates and kubeconfig files for tests: a CA, a server certificate for
127.0.0.1, client certificates (CN: the user, O: its groups), and a kubeconfig that
reaches the server with a token or with a client certificate."""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from dataclasses import dataclass

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class CertFiles:
    cert: str
    key: str


@dataclass(frozen=True)
class Pki:
    directory: str
    ca: CertFiles
    server: CertFiles

    def server_context(self) -> ssl.SSLContext:
        """The server's TLS: its certificate; client certificates of the CA optional
        (without one, a request must bring a token)."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=self.ca.cert)
        context.load_cert_chain(self.server.cert, self.server.key)
        context.verify_mode = ssl.CERT_OPTIONAL
        return context

    def client(self, user: str, groups: tuple[str, ...] = ()) -> CertFiles:
        """A client certificate of this CA for ``user``."""
        return _issue(self.directory, f"client-{user}", self.ca, user, groups, client=True)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(
    directory: str, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> CertFiles:
    cert_path = os.path.join(directory, f"{name}.crt")
    key_path = os.path.join(directory, f"{name}.key")
    with open(cert_path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(key_path, "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    os.chmod(key_path, 0o600)
    return CertFiles(cert_path, key_path)


def _builder(subject: x509.Name, issuer: x509.Name, public_key: object) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)  # type: ignore[arg-type]
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


def _issue(
    directory: str,
    name: str,
    ca: CertFiles,
    common_name: str,
    groups: tuple[str, ...] = (),
    client: bool = False,
) -> CertFiles:
    with open(ca.cert, "rb") as f:
        ca_cert = x509.load_pem_x509_certificate(f.read())
    with open(ca.key, "rb") as f:
        ca_key = serialization.load_pem_private_key(f.read(), None)
    key = _key()
    subject = x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
        + [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    )
    builder = _builder(subject, ca_cert.subject, key.public_key()).add_extension(
        x509.BasicConstraints(ca=False, path_length=None), critical=True
    )
    if client:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
    else:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    return _write(directory, name, cert, key)


def make_pki(directory: str) -> Pki:
    """A fresh CA and a server certificate for 127.0.0.1 under ``directory``."""
    os.makedirs(directory, exist_ok=True)
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "strict-api-ca")])
    cert = (
        _builder(subject, subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
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
        .sign(key, hashes.SHA256())
    )
    ca = _write(directory, "ca", cert, key)
    server = _issue(directory, "server", ca, "strict-api")
    return Pki(directory, ca, server)


def write_kubeconfig(
    path: str,
    server: str,
    *,
    token: str | None = None,
    client: CertFiles | None = None,
    ca_file: str | None = None,
    namespace: str = "default",
) -> str:
    """A kubeconfig with one context: the server, its CA, and a token or a client
    certificate."""
    user: dict[str, str] = {}
    if token is not None:
        user["token"] = token
    if client is not None:
        user["client-certificate"] = client.cert
        user["client-key"] = client.key
    cluster: dict[str, str] = {"server": server}
    if ca_file is not None:
        cluster["certificate-authority"] = ca_file
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "strict", "cluster": cluster}],
        "users": [{"name": "tester", "user": user}],
        "contexts": [
            {
                "name": "strict",
                "context": {"cluster": "strict", "user": "tester", "namespace": namespace},
            }
        ],
        "current-context": "strict",
    }
    with open(path, "w") as f:
        yaml.safe_dump(config, f)
    return path
