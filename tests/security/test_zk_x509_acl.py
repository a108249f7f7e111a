"""ZooKeeper ACLs by certificate identity: a cluster created over ZooKeeper's TLS port with
``--zk-acl-cert`` may be written only by the holders of those certificates (no password
anywhere), read by anyone, and a server authenticating with its certificate alone
registers and takes ownership; the nodes it creates carry the cluster's ACL."""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
from kazoo.exceptions import NoAuthError
from kazoo.security import Permissions

from waltz_client.cluster.admin import new_client_id, read_params
from waltz_client.cluster.identities import x509_writer
from waltz_client.cluster.paths import ClusterPaths
from waltz_client.cluster.zk import close, connect
from waltz_client.runtime.tls import TlsFiles
from waltz_client.tools.local.certs import local_pki
from waltz_client.tools.local.processes import DaemonProcess
from waltz_client.tools.local.zookeeper import EmbeddedZooKeeper

pytestmark = pytest.mark.timeout(300)

ROOT = "/x509-acl"


@pytest.fixture(scope="module")
def tls_zookeeper(tmp_path_factory):
    base = tmp_path_factory.mktemp("x509")
    pki = local_pki(
        str(base / "pki"),
        {
            "waltz-zookeeper": ["127.0.0.1", "localhost"],
            "waltz-admin": ["127.0.0.1"],
            "waltz-server-0": ["127.0.0.1"],
            "waltz-client": ["127.0.0.1"],
        },
    )
    zk = EmbeddedZooKeeper(str(base / "zk"), tls=pki["waltz-zookeeper"])
    zk.start()
    try:
        yield zk, pki, base
    finally:
        zk.stop()


def tls_args(files: TlsFiles) -> list[str]:
    return ["--zk-tls-cert", files.cert, "--zk-tls-key", files.key, "--zk-tls-ca", files.ca]


def waltz_cluster(zk: EmbeddedZooKeeper, files: TlsFiles, *args: str):
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "waltz_client.tools.cli",
            "cluster",
            *args,
            "--zookeeper",
            zk.secure_connect_string,
            "--root",
            ROOT,
            *tls_args(files),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_certificate_identities_write_the_metadata_and_anyone_reads_it(tls_zookeeper) -> None:
    zk, pki, base = tls_zookeeper
    admin_files, server_files = pki["waltz-admin"], pki["waltz-server-0"]
    proc = waltz_cluster(
        zk,
        admin_files,
        "create",
        "--name",
        "x509",
        "--partitions",
        "2",
        "--replicas",
        "1",
        "--storage",
        "127.0.0.1:1",
        "--zk-acl-cert",
        admin_files.cert,
        "--zk-acl-cert",
        server_files.cert,
    )
    assert proc.returncode == 0, proc.stderr
    paths = ClusterPaths.of(ROOT)

    client = connect(zk.secure_connect_string, tls=pki["waltz-client"])
    try:
        # Our DN matches the one ZooKeeper gives the connection (Java's RFC 2253 form).
        with open(zk.log_path, encoding="utf-8", errors="replace") as f:
            log = f.read()
        authenticated = set(re.findall(r"Authenticated Id '(.*?)' for scheme 'x509'", log))
        assert x509_writer(admin_files.cert).id in authenticated
        assert x509_writer(pki["waltz-client"].cert).id in authenticated

        acls, _ = client.get_acls(paths.ownership)
        assert {(a.id.scheme, a.id.id, a.perms) for a in acls} == {
            ("x509", x509_writer(admin_files.cert).id, Permissions.ALL),
            ("x509", x509_writer(server_files.cert).id, Permissions.ALL),
            ("world", "anyone", Permissions.READ),
        }
        # Another certificate of the same CA reads, not more (servers draw client IDs).
        assert read_params(client, ROOT).name == "x509"
        for write in (
            lambda: new_client_id(client, ROOT),
            lambda: client.set(paths.ownership, b"{}"),
            lambda: client.create(paths.access, b"{}"),
            lambda: client.create(paths.server("intruder"), b"{}", ephemeral=True),
        ):
            with pytest.raises(NoAuthError):
                write()

        # Another certificate is told, in one line, that it may not change the policy.
        proc = waltz_cluster(zk, pki["waltz-client"], "grant", "x", "--partitions", "0", "--read")
        assert proc.returncode == 1 and "Traceback" not in proc.stderr
        assert "error: ZooKeeper refused the change: this connection may not write" in (proc.stderr)
        # The admin's certificate may change the access policy; the node it creates
        # carries the cluster's ACL.
        proc = waltz_cluster(zk, admin_files, "grant", "svc", "--partitions", "0", "--read")
        assert proc.returncode == 0, proc.stderr
        access_acls, _ = client.get_acls(paths.access)
        assert sorted(access_acls) == sorted(acls)

        # A server with only its certificate (no zk_auth_file) registers and owns both
        # partitions: it writes the metadata as x509 identity.
        server = DaemonProcess(
            "server-0",
            [
                sys.executable,
                "-m",
                "waltz_server.main",
                "--zookeeper",
                zk.secure_connect_string,
                "--zk-root",
                ROOT,
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--http-port",
                "0",
                "--server-id",
                "server-0",
                "--ready-file",
                str(base / "server-0.ready"),
                *tls_args(server_files),
            ],
            str(base / "server-0.ready"),
            str(base / "server-0.log"),
        )
        server.start()
        try:
            deadline = time.monotonic() + 60
            while True:
                owners = {p: o for p, (o, _) in read_ownership(client, paths).items()}
                if owners == {0: "server-0", 1: "server-0"}:
                    break
                assert time.monotonic() < deadline, (owners, server.log_tail(30))
                time.sleep(0.2)
            registration_acls, _ = client.get_acls(paths.server("server-0"))
            assert sorted(registration_acls) == sorted(acls)
        finally:
            server.stop()
    finally:
        close(client)


def read_ownership(zk, paths: ClusterPaths):
    from waltz_client.cluster.metadata import Ownership

    data, _ = zk.get(paths.ownership)
    return Ownership.decode(data).partitions


def test_a_bad_acl_writer_is_refused_by_name(tls_zookeeper) -> None:
    zk, pki, _ = tls_zookeeper
    proc = waltz_cluster(
        zk,
        pki["waltz-admin"],
        "create",
        "--name",
        "bad",
        "--partitions",
        "1",
        "--replicas",
        "1",
        "--storage",
        "127.0.0.1:1",
        "--zk-acl",
        "CN=waltz-admin",
    )
    assert proc.returncode == 1
    assert "ACL writer 'CN=waltz-admin': expected SCHEME:ID" in proc.stderr
