"""The cluster CA the operator keeps (operator/waltz_operator/pki.py), pure: what it
plans to write for a set of Secrets at a given time, and what it issues. The issued
certificates are then used in real TLS handshakes on 127.0.0.1 with the daemons' own
TLS contexts, dialled for the names each holder is checked for in the cluster."""

from __future__ import annotations

import asyncio
import base64
import datetime
import pathlib
import ssl
from typing import Any

import kubernetes_validate
import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from waltz_client.runtime.tls import (
    TlsContexts,
    TlsFiles,
    identity_allowed,
    parse_patterns,
    peer_identity,
)
from waltz_operator import pki
from waltz_operator.desired import allowed_storage_peers
from waltz_operator.spec import parse

NOW = datetime.datetime(2026, 3, 1, 12, 0, tzinfo=datetime.UTC)
DAY = datetime.timedelta(days=1)


def spec_of(name: str = "demo", namespace: str = "prod"):
    return parse(
        {
            "metadata": {"name": name, "namespace": namespace, "uid": "u-1"},
            "spec": {"zookeeper": {"connect": "zk:2181"}},
        }
    )


SPEC = spec_of()


def issue_all(now: datetime.datetime = NOW, secrets: dict | None = None) -> dict[str, Any]:
    """Every Secret of a new cluster CA (or what the plan for ``secrets`` writes, over
    them), by name."""
    secrets = dict(secrets or {})
    issued = pki.issue(SPEC, pki.plan(SPEC, secrets, now), secrets, now)
    return {**secrets, **{s["metadata"]["name"]: s for s in issued.secrets}}


def data(secret: dict, key: str) -> bytes:
    return base64.b64decode(secret["data"][key])


def cert(secret: dict, key: str = "tls.crt") -> x509.Certificate:
    return x509.load_pem_x509_certificate(data(secret, key))


def dns_names(c: x509.Certificate) -> list[str]:
    try:
        san = c.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return san.get_values_for_type(x509.DNSName)


def usages(c: x509.Certificate) -> set:
    return set(c.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


# --- what a new cluster gets -------------------------------------------------------------


def test_a_new_cluster_gets_a_ca_and_every_certificate_with_the_names_it_is_checked_for():
    todo = pki.plan(SPEC, {}, NOW)
    assert (todo.authority, todo.publish) == (pki.CREATE, True)
    secrets = issue_all()
    assert sorted(secrets) == sorted(
        [
            "demo-ca",
            "demo-ca-cert",
            "demo-storage-tls",
            "demo-server-tls",
            "demo-client-tls",
            "demo-admin-tls",
        ]
    )
    for secret in secrets.values():  # owned by the resource: deleted with it
        (owner,) = secret["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"], owner["controller"]) == ("WaltzCluster", "u-1", True)
    ca = cert(secrets["demo-ca"], "ca.crt")
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert secrets["demo-ca"]["type"] == "Opaque"
    assert set(secrets["demo-ca-cert"]["data"]) == {"ca.crt"}  # no key: for scrapers
    expected = {
        "demo-storage-tls": (
            "waltz-storage",
            ["*.demo-storage.prod.svc", "*.demo-storage.prod.svc.cluster.local"],
            {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH},
        ),
        "demo-server-tls": (
            "waltz-server",
            ["demo", "demo.prod.svc", "demo.prod.svc.cluster.local"],
            {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH},
        ),
        "demo-client-tls": ("waltz-client", [], {ExtendedKeyUsageOID.CLIENT_AUTH}),
        "demo-admin-tls": ("waltz-admin", [], {ExtendedKeyUsageOID.CLIENT_AUTH}),
    }
    for name, (common_name, names, eku) in expected.items():
        secret = secrets[name]
        assert secret["type"] == "kubernetes.io/tls"
        assert set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}
        leaf = cert(secret)
        assert leaf.subject.rfc4514_string() == f"CN={common_name}"
        assert (dns_names(leaf), usages(leaf)) == (names, eku)
        leaf.verify_directly_issued_by(ca)
        assert data(secret, "ca.crt") == data(secrets["demo-ca"], "ca.crt")
        assert leaf.not_valid_after_utc - NOW == pki.LEAF_LIFETIME
        assert NOW - leaf.not_valid_before_utc == pki.BACKDATE  # clocks a little behind
    # As it should be: nothing more to write.
    assert pki.plan(SPEC, secrets, NOW).empty
    for secret in secrets.values():
        for version in ("1.30.0", "1.34.0"):
            kubernetes_validate.validate(secret, version, strict=True)


def test_storage_nodes_let_in_exactly_the_identities_that_dial_them():
    allowed = parse_patterns(allowed_storage_peers(SPEC))
    assert identity_allowed("waltz-server", allowed) and identity_allowed("waltz-admin", allowed)
    assert not identity_allowed("waltz-client", allowed)
    assert not identity_allowed("waltz-server-impostor", allowed)


# --- renewal ----------------------------------------------------------------------------


def test_leaves_are_renewed_two_thirds_into_their_life_in_the_same_secrets():
    secrets = issue_all()
    due = pki.renewal_time(cert(secrets["demo-server-tls"]))
    # Two thirds of 90 days (and of the few backdated minutes): 60 days after issuing.
    assert abs(due - (NOW + 60 * DAY)) < datetime.timedelta(minutes=5)
    assert pki.plan(SPEC, secrets, due - datetime.timedelta(seconds=1)).empty
    todo = pki.plan(SPEC, secrets, due)
    assert todo.authority is None and not todo.publish  # the CA is kept
    assert {p.secret for p, _ in todo.leaves} == {
        "demo-storage-tls",
        "demo-server-tls",
        "demo-client-tls",
        "demo-admin-tls",
    }
    assert all("renewed two thirds into its life" in why for _, why in todo.leaves)
    renewed = issue_all(due, secrets)
    for name in ("demo-server-tls", "demo-storage-tls"):
        old, new = cert(secrets[name]), cert(renewed[name])
        assert new.serial_number != old.serial_number
        assert new.not_valid_after_utc == due + pki.LEAF_LIFETIME
        assert data(renewed[name], "tls.key") != data(secrets[name], "tls.key")  # a new key
    assert renewed["demo-ca"] is secrets["demo-ca"]


@pytest.mark.parametrize(
    ("spoil", "why"),
    [
        (lambda s, o: s["data"].pop("tls.key"), "it has no 'tls.key'"),
        (lambda s, o: s["data"].update({"tls.crt": "bm90IGEgY2VydA=="}), "not a PEM certificate"),
        (lambda s, o: s["data"].update({"tls.key": o["data"]["tls.key"]}), "is not the key of"),
        (lambda s, o: s["data"].update({"ca.crt": o["data"]["tls.crt"]}), "ca.crt is not"),
        (
            lambda s, o: s["data"].update({"tls.crt": o["data"]["tls.crt"]}),
            "is not the key of",
        ),
    ],
    ids=["no-key", "not-a-certificate", "foreign-key", "stale-ca", "other-certificate"],
)
def test_a_spoiled_certificate_secret_is_issued_again_saying_why(spoil, why):
    secrets = issue_all()
    spoiled = {**secrets["demo-server-tls"], "data": dict(secrets["demo-server-tls"]["data"])}
    spoil(spoiled, secrets["demo-client-tls"])
    todo = pki.plan(SPEC, {**secrets, "demo-server-tls": spoiled}, NOW)
    assert todo.authority is None and not todo.publish
    ((profile, reason),) = todo.leaves
    assert profile.secret == "demo-server-tls" and why in reason


def test_a_certificate_of_another_ca_or_with_other_names_is_issued_again():
    secrets = issue_all()
    other_ca = issue_all(secrets=None)  # another cluster CA, same names
    foreign = dict(other_ca["demo-server-tls"])
    foreign["data"] = {**foreign["data"], "ca.crt": secrets["demo-ca"]["data"]["ca.crt"]}
    todo = pki.plan(SPEC, {**secrets, "demo-server-tls": foreign}, NOW)
    assert [(p.secret, w) for p, w in todo.leaves] == [
        ("demo-server-tls", "its certificate is not the cluster CA's")
    ]
    renamed = pki.leaf_secret(
        SPEC,
        pki.Profile("demo-server-tls", "waltz-server", ("demo.other.svc",), server=True),
        pki.read_authority(secrets["demo-ca"]),
        NOW,
    )
    todo = pki.plan(SPEC, {**secrets, "demo-server-tls": renamed}, NOW)
    assert [p.secret for p, _ in todo.leaves] == ["demo-server-tls"]
    assert "names" in todo.leaves[0][1]


def test_the_ca_is_renewed_with_its_key_and_every_leaf_with_it():
    secrets = issue_all()
    ca = cert(secrets["demo-ca"], "ca.crt")
    due = pki.renewal_time(ca)
    assert due - NOW > datetime.timedelta(days=365 * 6)
    todo = pki.plan(SPEC, secrets, due)
    assert (todo.authority, todo.publish, len(todo.leaves)) == (pki.RENEW, True, 4)
    renewed = issue_all(due, secrets)
    new_ca = cert(renewed["demo-ca"], "ca.crt")
    assert data(renewed["demo-ca"], "ca.key") == data(secrets["demo-ca"], "ca.key")
    assert new_ca.subject == ca.subject and new_ca.not_valid_after_utc > ca.not_valid_after_utc
    assert data(renewed["demo-ca-cert"], "ca.crt") == data(renewed["demo-ca"], "ca.crt")
    # Either CA certificate verifies leaves of either: pods roll onto it one by one.
    for leaf in (cert(secrets["demo-server-tls"]), cert(renewed["demo-server-tls"])):
        leaf.verify_directly_issued_by(ca)
        leaf.verify_directly_issued_by(new_ca)
    assert pki.plan(SPEC, renewed, due).empty


def test_a_lost_ca_is_replaced_and_every_leaf_issued_again():
    secrets = issue_all()
    broken = {**secrets["demo-ca"], "data": {"ca.crt": secrets["demo-ca"]["data"]["ca.crt"]}}
    todo = pki.plan(SPEC, {**secrets, "demo-ca": broken}, NOW)
    assert (todo.authority, todo.authority_reason, len(todo.leaves)) == (
        pki.CREATE,
        "it has no 'ca.key'",
        4,
    )
    assert pki.plan(SPEC, {k: v for k, v in secrets.items() if k != "demo-ca"}, NOW).authority == (
        pki.CREATE
    )


def test_a_leaf_never_outlives_its_ca():
    secrets = issue_all()
    ca = cert(secrets["demo-ca"], "ca.crt")
    late = ca.not_valid_after_utc - 10 * DAY
    leaf = pki.leaf_certificate(
        pki.profiles(SPEC)[1], pki.new_key(), pki.read_authority(secrets["demo-ca"]), late
    )
    assert leaf.not_valid_after_utc == ca.not_valid_after_utc


# --- real handshakes with what was issued ---------------------------------------------------


def files(secret: dict, directory: pathlib.Path) -> TlsFiles:
    directory.mkdir(parents=True, exist_ok=True)
    for key in ("tls.crt", "tls.key", "ca.crt"):
        (directory / key).write_bytes(data(secret, key))
    return TlsFiles(
        str(directory / "tls.crt"), str(directory / "tls.key"), str(directory / "ca.crt")
    )


async def handshake(listener: TlsFiles, dialer: TlsFiles, name: str) -> str | None:
    """Listen with ``listener`` as a daemon does (client certificates required), dial
    127.0.0.1 with ``dialer`` checking the certificate for ``name``: the identity the
    listener saw."""
    seen: list[str | None] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(peer_identity(writer.transport))
        writer.write(b"ok\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(
        handle, "127.0.0.1", 0, ssl=TlsContexts(listener, listening=True).listening_context()
    )
    port = server.sockets[0].getsockname()[1]
    try:
        context = TlsContexts(dialer, listening=False).current()
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=context, server_hostname=name
        )
        assert await reader.readline() == b"ok\n"
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
    return seen[0]


@pytest.mark.asyncio
async def test_the_issued_certificates_complete_the_handshakes_of_the_cluster(tmp_path):
    now = datetime.datetime.now(datetime.UTC)
    secrets = issue_all(now)
    storage = files(secrets["demo-storage-tls"], tmp_path / "storage")
    server = files(secrets["demo-server-tls"], tmp_path / "server")
    client = files(secrets["demo-client-tls"], tmp_path / "client")
    admin = files(secrets["demo-admin-tls"], tmp_path / "admin")
    # A server dials a storage pod by its stable name; an admin tool too.
    pod = "demo-storage-2.demo-storage.prod.svc"
    assert await handshake(storage, server, pod) == "waltz-server"
    assert await handshake(storage, admin, pod) == "waltz-admin"
    # A client checks a server for the client Service's name.
    assert await handshake(server, client, "demo.prod.svc") == "waltz-client"
    # Another name, or another cluster's CA, is refused.
    with pytest.raises(ssl.SSLCertVerificationError):
        await handshake(server, client, "other.prod.svc")
    other = issue_all(now)  # a second CA
    stranger = files(other["demo-client-tls"], tmp_path / "stranger")
    with pytest.raises((ssl.SSLError, ConnectionError)):
        await handshake(server, stranger, "demo.prod.svc")
