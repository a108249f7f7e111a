"""The chart's bundled ZooKeeper on TLS, for real: Apache ZooKeeper's own server (the jars
this repository runs ZooKeeper from, waltz_client/tools/local/zookeeper.py) started with the
zoo.cfg the image's entrypoint writes from the StatefulSet the chart renders (its
ZOO_SERVERS, ZOO_CFG_EXTRA, ...; only paths and ports moved onto this machine), serving
the certificate the operator's system PKI issues, mounted the way the kubelet mounts a
Secret. A client with only the chart's CA connects (hostname checked), a plain one does
not; the chart's probes pass against it; a renewed Secret is served to the next
connection without a restart; and the operator reconciles the chart's WaltzCluster
through it, giving its pods the CA alone.

Cluster DNS is played by resolving the pods' names to 127.0.0.1 (``cluster_dns``).
"""

from __future__ import annotations

import base64
import datetime
import os
import re
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from operator_harness import (
    NS,
    WZ,
    condition,
    create_cluster_object,
    eventually,
    kubernetes_api,
    obj,
    running_operator,
)
from test_helm import by_kind, render

from waltz_client.cluster.errors import ClusterError
from waltz_client.cluster.zk import close, connect
from waltz_client.runtime.tls import TlsFiles
from waltz_client.tools.local.cluster import _free_port as pick_port
from waltz_client.tools.local.zookeeper import (
    QUORUM_MAIN,
    ZooKeeperUnavailable,
    find_java,
    find_zookeeper_classpath,
)
from waltz_operator import system_pki
from waltz_operator.desired import desired_objects
from waltz_operator.spec import parse
from waltz_operator.zk_secrets import zk_access

pytestmark = pytest.mark.timeout(180)

NAMES = system_pki.SystemNames("rel-waltz-system", NS, "rel-waltz-operator", "rel-zookeeper")
# The official image's defaults (its Dockerfile's ENV) for what the chart does not set.
IMAGE_ENV = {
    "ZOO_TICK_TIME": "2000",
    "ZOO_INIT_LIMIT": "5",
    "ZOO_SYNC_LIMIT": "2",
    "ZOO_MAX_CLIENT_CNXNS": "60",
}


_PICKED: set[int] = set()


def _free_port() -> int:
    """Below the kernel's ephemeral range, in this worker's slice (as local clusters
    pick): a port from the ephemeral range may become some outgoing connection's source
    port before ZooKeeper binds it (a CI run failed so: "Address already in use")."""
    return pick_port(_PICKED)


def _mount(directory: Path, secret: dict[str, Any], stamp: str) -> None:
    """Write a Secret as the kubelet does: files in a timestamped directory, ``..data``
    pointing at it, and each key a symbolic link through ``..data``; a new version is a
    new directory and ``..data`` swapped atomically."""
    version = directory / f"..{stamp}"
    version.mkdir(parents=True)
    for key, value in secret["data"].items():
        (version / key).write_bytes(base64.b64decode(value))
    swap = directory / "..data_tmp"
    swap.symlink_to(version.name)
    os.replace(swap, directory / "..data")
    for key in secret["data"]:
        if not (directory / key).is_symlink():
            (directory / key).symlink_to(f"..data/{key}")


class Ensemble:
    """One ZooKeeper node run as the chart's StatefulSet pod would run it."""

    def __init__(self, root: Path, objects: list[dict]) -> None:
        self.root = root
        self.objects = objects
        (statefulset,) = by_kind(objects)["StatefulSet"]
        pod = statefulset["spec"]["template"]["spec"]
        (self.container,) = pod["containers"]
        self.env = {e["name"]: e.get("value", "") for e in self.container["env"]}
        mounts = {m["name"]: m["mountPath"] for m in self.container["volumeMounts"]}
        secret_volumes = {
            v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v
        }
        # Where each mount path of the pod is on this machine.
        self.paths = {path: root / name for name, path in mounts.items()}
        self.tls_secret = secret_volumes["tls"]
        self.tls_dir = self.paths[mounts["tls"]]
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def local(self, text: str) -> str:
        """``text`` with the pod's mount paths as this machine's (in one pass: a path
        put in must not be mapped again)."""
        paths = sorted(self.paths, key=len, reverse=True)
        pattern = "|".join(re.escape(p) for p in paths)
        return re.sub(
            rf"(?<![\w/.])({pattern})(?=/|\s|$)", lambda m: str(self.paths[m.group(1)]), text
        )

    def config(self) -> str:
        """zoo.cfg as docker-entrypoint.sh (zookeeper:3.9) writes it from the env."""
        env = {**IMAGE_ENV, **self.env}
        lines = [
            f"dataDir={env['ZOO_DATA_DIR']}",
            f"dataLogDir={env['ZOO_DATA_LOG_DIR']}",
            f"tickTime={env['ZOO_TICK_TIME']}",
            f"initLimit={env['ZOO_INIT_LIMIT']}",
            f"syncLimit={env['ZOO_SYNC_LIMIT']}",
            f"autopurge.snapRetainCount={env['ZOO_AUTOPURGE_SNAPRETAINCOUNT']}",
            f"autopurge.purgeInterval={env['ZOO_AUTOPURGE_PURGEINTERVAL']}",
            f"maxClientCnxns={env['ZOO_MAX_CLIENT_CNXNS']}",
            f"standaloneEnabled={env['ZOO_STANDALONE_ENABLED']}",
            f"admin.enableServer={env['ZOO_ADMINSERVER_ENABLED']}",
        ]
        for server in env["ZOO_SERVERS"].split():
            # server.1=<pod>.<headless>.<ns>.svc:2888:3888 -> this machine's ports
            key, _, address = server.partition("=")
            _host, _quorum, election = address.split(":", 2)
            assert election == "3888", f"a plain client port in {server!r}"
            lines.append(f"{key}=127.0.0.1:{_free_port()}:{_free_port()}")
        lines.append(f"4lw.commands.whitelist={env['ZOO_4LW_COMMANDS_WHITELIST']}")
        for entry in env["ZOO_CFG_EXTRA"].split():
            lines.append(re.sub(r"^secureClientPort=2281$", f"secureClientPort={self.port}", entry))
        return self.local("\n".join(lines)) + "\n"

    def start(self, secret: dict[str, Any], stamp: str) -> None:
        _mount(self.tls_dir, secret, stamp)
        data_dir = Path(self.local(self.env["ZOO_DATA_DIR"]))
        data_dir.mkdir(parents=True)
        Path(self.local(self.env["ZOO_DATA_LOG_DIR"])).mkdir(parents=True)
        (data_dir / "myid").write_text("1\n")  # ZOO_MY_ID of pod 0
        self.config_path = self.root / "zoo.cfg"
        self.config_path.write_text(self.config())
        self.log = open(self.root / "zookeeper.log", "wb")  # noqa: SIM115 - the JVM's life
        self.proc = subprocess.Popen(
            [
                *(find_java(), "-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"),
                *("-cp", find_zookeeper_classpath(), QUORUM_MAIN, str(self.config_path)),
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def word(self, command: str, ca: str | None = None, timeout: float = 5.0) -> str | None:
        """A four-letter word over TLS (None: no TLS answer)."""
        context = ssl.create_default_context(cafile=ca) if ca else ssl._create_unverified_context()
        context.check_hostname = False
        try:
            with (
                socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as raw,
                context.wrap_socket(raw) as conn,
            ):
                conn.sendall(command.encode())
                chunks = []
                while chunk := conn.recv(65536):
                    chunks.append(chunk)
        except (OSError, ssl.SSLError):
            return None
        return b"".join(chunks).decode()

    def served_certificate(self) -> x509.Certificate:
        context = ssl._create_unverified_context()
        with (
            socket.create_connection(("127.0.0.1", self.port), timeout=10) as raw,
            context.wrap_socket(raw) as conn,
        ):
            der = conn.getpeercert(binary_form=True)
        assert der is not None
        return x509.load_der_x509_certificate(der)

    def wait_serving(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(
                    "ZooKeeper exited: " + (self.root / "zookeeper.log").read_text()[-3000:]
                )
            if "Mode: leader" in (self.word("srvr", timeout=1.0) or ""):
                return
            time.sleep(0.2)
        raise AssertionError("ZooKeeper did not serve over TLS in time")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
        self.log.close()


def connect_string(objects: list[dict], port: int) -> str:
    """The chart's WaltzCluster's connect string, its port this machine's."""
    (cluster,) = by_kind(objects)["WaltzCluster"]
    connect_to = cluster["spec"]["zookeeper"]["connect"]
    assert connect_to.endswith(":2281")
    return connect_to.replace(":2281", f":{port}")


# Issued 61 days ago, so that the renewal "today" is due and its certificate valid now.
ISSUED = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=61)


@pytest.fixture(scope="module")
def system_secrets() -> dict[str, dict]:
    issued = system_pki.issue(NAMES, system_pki.plan(NAMES, {}, ISSUED), {}, ISSUED)
    return {s["metadata"]["name"]: s for s in issued.secrets}


@pytest.fixture(scope="module")
def ensemble(tmp_path_factory, system_secrets) -> Iterator[Ensemble]:
    try:
        find_java()
        find_zookeeper_classpath()
    except ZooKeeperUnavailable as exc:
        pytest.skip(f"ZooKeeper unavailable: {exc}")
    objects = render("--set", "cluster.enabled=true,zookeeper.bundled.replicas=1", namespace=NS)
    node = Ensemble(tmp_path_factory.mktemp("zookeeper-tls"), objects)
    node.start(system_secrets[node.tls_secret], "2026_01_01_00_00_00.1")
    try:
        node.wait_serving()
        yield node
    finally:
        node.stop()


@pytest.fixture
def cluster_dns(monkeypatch) -> None:
    """The cluster's DNS: the ZooKeeper pods' and Services' names are this machine."""
    real = socket.getaddrinfo

    def resolve(host: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host.endswith(f".{NS}.svc") and "zookeeper" in host:
            host = "127.0.0.1"
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)


def ca_file(tmp_path: Path, system_secrets: dict[str, dict]) -> str:
    """ca.crt of <prefix>-ca-cert: all a client of ZooKeeper is given."""
    secret = system_secrets[NAMES.ca_cert_secret]
    assert secret["data"].keys() == {"ca.crt"}
    path = tmp_path / "ca.crt"
    path.write_bytes(base64.b64decode(secret["data"]["ca.crt"]))
    return str(path)


def test_a_client_with_only_the_ca_connects_over_tls_and_a_plain_one_cannot(
    ensemble, system_secrets, cluster_dns, tmp_path
):
    config = ensemble.config_path.read_text()
    assert "clientPort" not in config.replace("secureClientPort", "")  # no plain port
    ca = ca_file(tmp_path, system_secrets)
    hosts = connect_string(ensemble.objects, ensemble.port)
    zk = connect(hosts, 20.0, tls=TlsFiles(None, None, ca))  # kazoo checks the host name
    try:
        zk.create("/tls-check", b"over tls")
        assert zk.get("/tls-check")[0] == b"over tls"
    finally:
        close(zk)
    with pytest.raises(ClusterError, match="did not answer"):
        close(connect(hosts, 2.0))  # plain text to the TLS port
    # A name the certificate does not have (the pod's IP) is refused.
    with pytest.raises(ClusterError, match="did not answer"):
        close(connect(f"127.0.0.1:{ensemble.port}", 2.0, tls=TlsFiles(None, None, ca)))


def test_the_charts_probes_pass_against_it(ensemble, system_secrets, tmp_path):
    for probe in ("readinessProbe", "livenessProbe"):
        script = ensemble.container[probe]["exec"]["command"][2]
        script = ensemble.local(script).replace("127.0.0.1:2281", f"127.0.0.1:{ensemble.port}")
        result = subprocess.run(["/bin/bash", "-c", script], timeout=30)
        assert result.returncode == 0, probe


def test_a_renewed_certificate_is_served_to_new_connections_without_a_restart(
    ensemble, system_secrets, cluster_dns, tmp_path
):
    now = datetime.datetime.now(datetime.UTC)
    todo = system_pki.plan(NAMES, system_secrets, now)
    assert {p.secret for p, _ in todo.leaves} >= {NAMES.zookeeper_secret}
    issued = system_pki.issue(NAMES, todo, system_secrets, now)
    renewed = {s["metadata"]["name"]: s for s in issued.secrets}[NAMES.zookeeper_secret]
    before = ensemble.served_certificate()
    pid = ensemble.proc.pid
    _mount(ensemble.tls_dir, renewed, "2026_03_02_00_00_00.2")  # what the kubelet does
    served = ensemble.served_certificate()
    new = x509.load_pem_x509_certificate(base64.b64decode(renewed["data"]["tls.crt"]))
    assert served.serial_number == new.serial_number != before.serial_number
    assert ensemble.proc.pid == pid and ensemble.proc.poll() is None
    # Clients with the CA they had verify the new one (same CA).
    ca = ca_file(tmp_path, system_secrets)
    zk = connect(
        connect_string(ensemble.objects, ensemble.port), 20.0, tls=TlsFiles(None, None, ca)
    )
    close(zk)


@pytest.mark.asyncio
async def test_the_operator_runs_the_charts_cluster_through_it_with_the_ca_alone(
    ensemble, system_secrets, cluster_dns, tmp_path
):
    (cluster,) = by_kind(ensemble.objects)["WaltzCluster"]
    doc = {
        "apiVersion": cluster["apiVersion"],
        "kind": "WaltzCluster",
        "metadata": {"name": cluster["metadata"]["name"], "namespace": NS},
        "spec": {
            **cluster["spec"],
            "zookeeper": {
                **cluster["spec"]["zookeeper"],
                "connect": connect_string(ensemble.objects, ensemble.port),
            },
        },
    }
    assert doc["spec"]["zookeeper"]["tlsSecret"] == NAMES.ca_cert_secret
    name = doc["metadata"]["name"]
    async with kubernetes_api() as api:
        api.put(system_secrets[NAMES.ca_cert_secret])  # as the operator's system PKI made it
        create_cluster_object(api, doc)
        async with running_operator(api, NS, interval=0.2):
            await eventually(
                lambda: condition(obj(api, WZ, NS, name), "ClusterCreated").get("status") == "True",
                what="ClusterCreated",
            )
            for component in ("storage", "server"):
                config_map = await eventually(
                    lambda c=component: obj(api, "v1/configmaps", NS, f"{name}-{c}-config")
                )
                prefix = f"WALTZ_{component.upper()}_ZK_TLS_"
                zk_settings = {k: v for k, v in config_map["data"].items() if k.startswith(prefix)}
                # Verify ZooKeeper with the CA; no client certificate to present.
                assert zk_settings == {f"{prefix}CA": "/etc/waltz/zk-tls/ca.crt"}
            sts = obj(api, "apps/v1/statefulsets", NS, f"{name}-storage")
            (volume,) = [
                v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "zk-tls"
            ]
            assert volume["secret"]["secretName"] == NAMES.ca_cert_secret
            assert volume["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    # The metadata is in the TLS ensemble.
    ca = ca_file(tmp_path, system_secrets)
    zk = connect(
        connect_string(ensemble.objects, ensemble.port), 20.0, tls=TlsFiles(None, None, ca)
    )
    try:
        assert zk.exists(f"/waltz/{NS}/{name}") is not None
    finally:
        close(zk)


# --- the pure parts of the CA-only path ----------------------------------------------------


@pytest.mark.asyncio
async def test_a_tls_secret_with_only_a_ca_gives_the_ca_alone(system_secrets, tmp_path):
    doc = {
        "metadata": {"name": "demo", "namespace": NS, "uid": "u-1"},
        "spec": {"zookeeper": {"connect": "zk:2281", "tlsSecret": NAMES.ca_cert_secret}},
    }
    spec = parse(doc)

    async def get_secret(namespace: str, secret: str) -> dict | None:
        return system_secrets.get(secret) if namespace == NS else None

    access = await zk_access(spec, get_secret, str(tmp_path), credential=False)
    assert access.tls is not None and access.tls_client_certificate is False
    assert (access.tls.cert, access.tls.key) == (None, None)
    assert Path(access.tls.ca).read_bytes() == base64.b64decode(
        system_secrets[NAMES.ca_cert_secret]["data"]["ca.crt"]
    )
    # A Secret with a client certificate keeps presenting it.
    with_cert = {
        **doc,
        "spec": {"zookeeper": {**doc["spec"]["zookeeper"], "tlsSecret": NAMES.zookeeper_secret}},
    }
    access = await zk_access(parse(with_cert), get_secret, str(tmp_path), credential=False)
    assert access.tls_client_certificate is True and access.tls.cert and access.tls.key
    # What the pods get, either way.
    for client_certificate, expected in ((False, {"CA"}), (True, {"CERT", "KEY", "CA"})):
        made = desired_objects(replace(spec, zk_tls_client_certificate=client_certificate))
        (config_map,) = [o for o in made if o["metadata"]["name"] == "demo-storage-config"]
        assert {k for k in config_map["data"] if "ZK_TLS" in k} == {
            f"WALTZ_STORAGE_ZK_TLS_{e}" for e in expected
        }
