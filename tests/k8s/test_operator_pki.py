"""Secure by default (issue 39, part 1), on the strict API server (strict_api/) with a
real ZooKeeper: a WaltzCluster that names no certificates gets the operator's own CA,
every certificate issued into the Secrets its pods mount, mutual TLS on every link,
HTTPS on the metrics ports, and its metadata under a ZooKeeper credential the operator
makes; a certificate near expiry is issued again in place; ``disabled`` is plain text;
and a running cluster's mode cannot be switched under it."""

from __future__ import annotations

import asyncio
import base64
import datetime
import ssl
from dataclasses import replace

import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from kazoo.security import Permissions
from operator_harness import (
    NS,
    WZ,
    cluster_doc,
    condition,
    create_cluster_object,
    events,
    eventually,
    kubernetes_api,
    obj,
    running_operator,
)

from waltz_client.cluster.admin import create_cluster
from waltz_client.cluster.metadata import ServerRegistration
from waltz_client.cluster.paths import ClusterPaths
from waltz_operator import pki
from waltz_operator.desired import desired_objects
from waltz_operator.monitor import ClusterMonitor, HttpsScrape, MonitorSettings
from waltz_operator.spec import parse

SECRETS = "v1/secrets"
LEAVES = {
    "demo-storage-tls": (
        "waltz-storage",
        ["*.demo-storage.prod.svc", "*.demo-storage.prod.svc.cluster.local"],
    ),
    "demo-server-tls": ("waltz-server", ["demo", "demo.prod.svc", "demo.prod.svc.cluster.local"]),
    "demo-client-tls": ("waltz-client", []),
    "demo-admin-tls": ("waltz-admin", []),
}

pytestmark = pytest.mark.timeout(180)


def default_doc(zookeeper, zk_root: str) -> dict:
    """A WaltzCluster as a user writes it: nothing about TLS."""
    doc = cluster_doc(zookeeper, zk_root)
    del doc["spec"]["tls"]
    return doc


def secret(api, name: str) -> dict | None:
    return obj(api, SECRETS, NS, name)


def certificate(found: dict, key: str = "tls.crt") -> x509.Certificate:
    return x509.load_pem_x509_certificate(base64.b64decode(found["data"][key]))


def names(cert: x509.Certificate) -> tuple[str, list[str]]:
    common = cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        return str(common), san.get_values_for_type(x509.DNSName)
    except x509.ExtensionNotFound:
        return str(common), []


def pod_of(api, kind: str, name: str) -> tuple[dict, dict, dict[str, str]]:
    """(workload, its container, the settings of its ConfigMap)."""
    workload = obj(api, kind, NS, name)
    container = workload["spec"]["template"]["spec"]["containers"][0]
    config = container["envFrom"][0]["configMapRef"]["name"]
    return workload, container, obj(api, "v1/configmaps", NS, config)["data"]


def secret_volumes(workload: dict) -> dict[str, str]:
    return {
        v["name"]: v["secret"]["secretName"]
        for v in workload["spec"]["template"]["spec"]["volumes"]
        if "secret" in v
    }


async def created(api) -> dict:
    return await eventually(
        lambda: (
            (b := obj(api, WZ, NS, "demo"))
            and condition(b, "ClusterCreated").get("status") == "True"
            and b
        ),
        what="ClusterCreated",
    )


@pytest.mark.asyncio
async def test_a_default_cluster_runs_on_the_operators_ca_and_credential(zookeeper, zk, zk_root):
    async with kubernetes_api() as api:
        create_cluster_object(api, default_doc(zookeeper, zk_root))
        async with running_operator(api, NS, interval=0.2) as config:
            body = await created(api)
            await eventually(lambda: obj(api, "apps/v1/deployments", NS, "demo-server"))
            uid = body["metadata"]["uid"]
            # The mode it defaulted to is written into the spec (fixed from now on).
            assert body["spec"]["tls"]["mode"] == "operator"
            # kopf posts Events from a queue of its own: they may follow the change.
            await eventually(lambda: events(api, "TlsModeRecorded"), what="TlsModeRecorded")

            # The CA, published without its key, and every certificate, all owned.
            ca_secret = secret(api, "demo-ca")
            ca = certificate(ca_secret, "ca.crt")
            assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
            assert "ca.key" in ca_secret["data"]
            assert secret(api, "demo-ca-cert")["data"] == {"ca.crt": ca_secret["data"]["ca.crt"]}
            for name, expected in LEAVES.items():
                found = secret(api, name)
                assert found["type"] == "kubernetes.io/tls", name
                leaf = certificate(found)
                assert names(leaf) == expected
                leaf.verify_directly_issued_by(ca)
                assert found["data"]["ca.crt"] == ca_secret["data"]["ca.crt"]
            for name in ("demo-ca", "demo-ca-cert", *LEAVES):
                (owner,) = secret(api, name)["metadata"]["ownerReferences"]
                assert (owner["kind"], owner["uid"]) == ("WaltzCluster", uid)

            # Storage pods serve their certificate, let in servers and admin tools only,
            # and serve HTTPS on the metrics port (probed over HTTPS).
            sts, container, settings = pod_of(api, "apps/v1/statefulsets", "demo-storage")
            assert secret_volumes(sts) == {"tls": "demo-storage-tls"}
            assert {k: v for k, v in settings.items() if "TLS" in k} == {
                "WALTZ_STORAGE_TLS_CERT": "/etc/waltz/tls/tls.crt",
                "WALTZ_STORAGE_TLS_KEY": "/etc/waltz/tls/tls.key",
                "WALTZ_STORAGE_TLS_CA": "/etc/waltz/tls/ca.crt",
                "WALTZ_STORAGE_TLS_ALLOWED_PEERS": "waltz-server,waltz-admin",
                "WALTZ_STORAGE_HTTP_TLS": "true",
            }
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                assert container[probe]["httpGet"]["scheme"] == "HTTPS"
            template = sts["spec"]["template"]["metadata"]["annotations"]
            assert template["waltz.io/metrics-scheme"] == "https"  # for the PodMonitor
            assert sts["metadata"]["annotations"]["waltz.io/tls-mode"] == "operator"

            # Servers: mutual TLS with clients and with storage, checked for the Service
            # name; they write the metadata with the operator's credential.
            deployment, container, settings = pod_of(api, "apps/v1/deployments", "demo-server")
            assert secret_volumes(deployment) == {
                "tls": "demo-server-tls",
                "zk-auth": "demo-zookeeper-credential",
            }
            assert {k: v for k, v in settings.items() if "TLS" in k or "AUTH" in k} == {
                "WALTZ_SERVER_TLS_CERT": "/etc/waltz/tls/tls.crt",
                "WALTZ_SERVER_TLS_KEY": "/etc/waltz/tls/tls.key",
                "WALTZ_SERVER_TLS_CA": "/etc/waltz/tls/ca.crt",
                "WALTZ_SERVER_TLS_VERIFY_PEER": "true",
                "WALTZ_SERVER_STORAGE_TLS_CERT": "/etc/waltz/tls/tls.crt",
                "WALTZ_SERVER_STORAGE_TLS_KEY": "/etc/waltz/tls/tls.key",
                "WALTZ_SERVER_STORAGE_TLS_CA": "/etc/waltz/tls/ca.crt",
                "WALTZ_SERVER_ADVERTISED_TLS_NAME": "demo.prod.svc",
                "WALTZ_SERVER_HTTP_TLS": "true",
                "WALTZ_SERVER_ZK_AUTH_FILE": "/etc/waltz/zk-auth/credential",
            }
            assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"

            # The credential: random, not owned (it outlives the resource with the
            # metadata), and the one the metadata's ACL names.
            credential = secret(api, "demo-zookeeper-credential")
            assert "ownerReferences" not in credential["metadata"]
            user, _, password = base64.b64decode(credential["data"]["credential"]).partition(b":")
            assert user == b"waltz" and len(password) >= 32
            acls, _ = zk.get_acls(ClusterPaths.of(zk_root).cluster)
            assert {(a.id.scheme, a.perms) for a in acls} == {
                ("digest", Permissions.ALL),
                ("world", Permissions.READ),
            }

            # Idle: certificates and credential as they should be are neither written
            # again nor read (they are watched).
            reconciles = config.metrics.reconciles.labels(f"{NS}/demo")
            settled = reconciles._value.get() + 5  # the watch has caught up with the writes
            await eventually(lambda: reconciles._value.get() >= settled, what="settled")
            counted, start = reconciles._value.get(), len(api.requests)
            await eventually(lambda: reconciles._value.get() >= counted + 10, what="10 more")
            assert [
                f"{r.method} {r.path}"
                for r in api.requests[start:]
                if "/secrets" in r.path and r.query.get("watch") not in ("true", "1")
            ] == []

            # The credential deleted under metadata written with it: a new one could not
            # write the metadata, so none is made and the status says what to do.
            api.remove(SECRETS, NS, "demo-zookeeper-credential")
            body = await eventually(
                lambda: (
                    (b := obj(api, WZ, NS, "demo"))
                    and condition(b, "Degraded").get("reason") == "SecretUnusable"
                    and b
                ),
                what="Degraded SecretUnusable",
            )
            assert "written under a credential's ACL" in condition(body, "Degraded")["message"]
            assert secret(api, "demo-zookeeper-credential") is None


@pytest.mark.asyncio
async def test_a_certificate_near_expiry_is_issued_again_in_place(zookeeper, zk_root):
    async with kubernetes_api() as api:
        create_cluster_object(api, default_doc(zookeeper, zk_root))
        async with running_operator(api, NS, interval=0.2):
            body = await created(api)
            before = await eventually(lambda: secret(api, "demo-server-tls"))
            # Someone (or time) left the server certificate 61 days into its 90.
            spec = parse(body)
            authority = pki.read_authority(secret(api, "demo-ca"))
            (profile,) = [p for p in pki.profiles(spec) if p.secret == "demo-server-tls"]
            issued = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=61)
            old = pki.leaf_secret(spec, profile, authority, issued)
            api.patch(SECRETS, NS, "demo-server-tls", {"data": old["data"]})
            stale = certificate(secret(api, "demo-server-tls"))
            renewed = await eventually(
                lambda: (
                    (s := secret(api, "demo-server-tls"))
                    and certificate(s).serial_number != stale.serial_number
                    and s
                ),
                what="the certificate issued again",
            )
            (event,) = await eventually(
                lambda: [
                    e
                    for e in events(api, "CertificateIssued")
                    if "demo-server-tls" in e["message"] and "two thirds" in e["message"]
                ],
                what="the CertificateIssued Event",
            )
        fresh = certificate(renewed)
        left = fresh.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
        assert left > datetime.timedelta(days=89)
        assert names(fresh) == LEAVES["demo-server-tls"]
        fresh.verify_directly_issued_by(certificate(secret(api, "demo-ca"), "ca.crt"))
        # In place: the same Secret, which the pods keep mounted (the daemons reload it).
        assert renewed["metadata"]["uid"] == before["metadata"]["uid"]
        assert "tls.key" not in event["message"]


@pytest.mark.asyncio
async def test_disabled_is_plain_text_and_the_mode_cannot_switch(zookeeper, zk_root):
    async with kubernetes_api() as api:
        create_cluster_object(api, cluster_doc(zookeeper, zk_root))  # tls.mode disabled
        async with running_operator(api, NS, interval=0.2):
            await created(api)
            sts, container, settings = await eventually(
                lambda: pod_of(api, "apps/v1/statefulsets", "demo-storage")
            )
            deployment, _, server_settings = await eventually(
                lambda: pod_of(api, "apps/v1/deployments", "demo-server")
            )
        assert secret_volumes(sts) == secret_volumes(deployment) == {}
        assert not [k for k in {**settings, **server_settings} if "TLS" in k or "AUTH" in k]
        assert "scheme" not in container["readinessProbe"]["httpGet"]
        assert "waltz.io/metrics-scheme" not in sts["spec"]["template"]["metadata"]["annotations"]
        assert [s["metadata"]["name"] for s in api.list(SECRETS, NS)] == []
        # The API server refuses a switch: pods of both kinds could not reach each other.
        response = await api.request(
            "PATCH",
            f"/apis/waltz.io/v1alpha1/namespaces/{NS}/waltzclusters/demo",
            {"spec": {"tls": {"mode": "operator"}}},
            content_type="application/merge-patch+json",
            query={"fieldManager": "kubectl"},
        )
        assert response.status == 422, response.body
        assert "spec.tls.mode" in response.body["message"]
        assert "cannot change once set" in response.body["message"]


@pytest.mark.asyncio
async def test_a_plain_cluster_from_before_the_mode_keeps_running_plain(zookeeper, zk_root):
    """Made by an operator that had no spec.tls.mode: its resource says nothing about TLS
    (the default would be the operator's CA), but its StatefulSet's pods run in plain
    text. The mode they run with is written into the spec, and nothing is switched."""
    async with kubernetes_api() as api:
        doc = default_doc(zookeeper, zk_root)
        stored = create_cluster_object(api, doc)
        # The StatefulSet it made: this operator's, less what it had not yet (the mode
        # annotation), without certificates.
        before = parse(stored)
        before = replace(before, tls=replace(before.tls, mode="disabled"))
        (old,) = [o for o in desired_objects(before) if o["kind"] == "StatefulSet"]
        del old["metadata"]["annotations"]
        api.put(old, manager="waltz-operator")
        async with running_operator(api, NS, interval=0.2):
            body = await created(api)
            assert body["spec"]["tls"]["mode"] == "disabled"
            await eventually(
                lambda: (
                    obj(api, "apps/v1/statefulsets", NS, "demo-storage")["metadata"]
                    .get("annotations", {})
                    .get("waltz.io/tls-mode")
                    == "disabled"
                ),
                what="the StatefulSet applied",
            )
        _, _, settings = pod_of(api, "apps/v1/statefulsets", "demo-storage")
        assert not [k for k in settings if "TLS" in k]
        assert api.list(SECRETS, NS) == []
        assert condition(obj(api, WZ, NS, "demo"), "Degraded").get("status") != "True"


# --- the operator checks the daemons' HTTPS against the cluster's CA ---------------------


def served_with(leaf: dict, directory) -> ssl.SSLContext:
    """A daemon's HTTPS port: its certificate, no client certificate asked."""
    directory.mkdir()
    for key in ("tls.crt", "tls.key"):
        (directory / key).write_bytes(base64.b64decode(leaf["data"][key]))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(directory / "tls.crt"), str(directory / "tls.key"))
    return context


@pytest.mark.asyncio
async def test_the_monitor_scrapes_servers_over_https_checking_the_name_they_publish(
    zookeeper, zk, zk_root, tmp_path
):
    """A server is scraped at its pod IP, which its certificate does not name: the monitor
    checks the certificate for the name the server publishes, against the cluster's CA."""
    spec = parse(
        {
            "metadata": {"name": "demo", "namespace": NS, "uid": "u-1"},
            "spec": {"zookeeper": {"connect": zookeeper.connect_string}},
        }
    )
    now = datetime.datetime.now(datetime.UTC)
    secrets = {}
    for _ in range(2):  # the CA, then what it issues
        issued = pki.issue(spec, pki.plan(spec, secrets, now), secrets, now)
        secrets.update({s["metadata"]["name"]: s for s in issued.secrets})
    ca = base64.b64decode(secrets["demo-ca-cert"]["data"]["ca.crt"])
    other_ca = pki.ca_certificate(pki.new_key(), "another CA", now).public_bytes(
        serialization.Encoding.PEM
    )

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text="")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(
        runner, "127.0.0.1", 0, ssl_context=served_with(secrets["demo-server-tls"], tmp_path / "s")
    )
    await site.start()
    port = runner.addresses[0][1]
    await asyncio.to_thread(create_cluster, zk, zk_root, "https", 1, 1, ["127.0.0.1:1"])
    registration = ServerRegistration("server-0", "127.0.0.1", 1, port, tls_name="demo.prod.svc")
    await asyncio.to_thread(
        zk.create, ClusterPaths.of(zk_root).server("server-0"), registration.encode(), None, True
    )
    settings = MonitorSettings(scrape_interval=0.3, scrape_timeout=5.0, zk_timeout=10.0)

    async def problems(https: HttpsScrape | None) -> tuple[str, ...]:
        monitor = ClusterMonitor(
            zookeeper.connect_string, zk_root, lambda a: None, settings, https=https
        )
        try:
            view = await eventually(
                lambda: monitor.view and "server-0" in monitor.view.servers and monitor.view,
                what="the server scraped",
            )
            return view.problems
        finally:
            await monitor.close()

    try:
        assert await problems(HttpsScrape(ca)) == ()
        (refused,) = await problems(HttpsScrape(other_ca))
        assert "server server-0" in refused and "certificate verify failed" in refused.lower()
        (plain,) = await problems(None)  # plain HTTP to an HTTPS port
        assert "server server-0" in plain
    finally:
        await runner.cleanup()
