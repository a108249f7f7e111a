"""A throw-away certificate authority for a local cluster with TLS on (``waltz local up``
and ``waltz demo`` unless ``--insecure``) and for tests: a CA and one certificate per
identity, as PEM files in a directory.

Not for production: the CA key sits next to the certificates. On Kubernetes the
certificates come from Secrets (docs/security.md).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from waltz_client.runtime.tls import TlsFiles

if TYPE_CHECKING:
    import trustme

CA_FILE = "ca.pem"


def _paths(directory: str, identity: str) -> tuple[str, str]:
    return os.path.join(directory, f"{identity}.pem"), os.path.join(directory, f"{identity}.key")


def local_pki(
    directory: str, identities: dict[str, list[str]], *, ca_name: str = "waltz local CA"
) -> dict[str, TlsFiles]:
    """TlsFiles for each identity (its common name) with the given host names and IPs as
    subject alternative names. Files already there are kept (a restarted cluster keeps
    its certificates); missing ones are issued by the CA, which is made if missing."""
    import trustme  # the `local` extra (`make` installs it): TLS local clusters and tests

    os.makedirs(directory, exist_ok=True)
    ca_path = os.path.join(directory, CA_FILE)
    ca_key_path = os.path.join(directory, "ca.key")
    if os.path.exists(ca_path) and os.path.exists(ca_key_path):
        with open(ca_path, "rb") as c, open(ca_key_path, "rb") as k:
            ca = trustme.CA.from_pem(c.read(), k.read())
    else:
        ca = trustme.CA(organization_name=ca_name)
        ca.cert_pem.write_to_path(ca_path)
        ca.private_key_pem.write_to_path(ca_key_path)
        os.chmod(ca_key_path, 0o600)
    out = {}
    for identity, hosts in identities.items():
        cert_path, key_path = _paths(directory, identity)
        if not (os.path.exists(cert_path) and os.path.exists(key_path)):
            issue(ca, identity, hosts, cert_path, key_path)
        out[identity] = TlsFiles(cert_path, key_path, ca_path)
    return out


def issue(ca: trustme.CA, identity: str, hosts: list[str], cert_path: str, key_path: str) -> None:
    """Write a certificate for ``identity`` signed by ``ca`` (a trustme.CA)."""
    leaf = ca.issue_cert(*hosts, common_name=identity)
    with open(cert_path, "wb") as f:
        for blob in leaf.cert_chain_pems:
            f.write(blob.bytes())
    leaf.private_key_pem.write_to_path(key_path)
    os.chmod(key_path, 0o600)
