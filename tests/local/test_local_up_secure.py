"""``waltz local up`` is secure by default: mutual TLS on every link, the metadata under
ZooKeeper ACLs, and every port it opens (ZooKeeper's too) on loopback only."""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys

import pytest
from kazoo.exceptions import NoAuthError

from waltz_client.cluster.paths import ClusterPaths
from waltz_client.cluster.zk import close, connect
from waltz_client.tools.local.cluster import LocalCluster, LocalClusterError

pytestmark = pytest.mark.timeout(180)

LISTEN = "0A"  # TCP state in /proc/net/tcp


def descendants(pid: int) -> set[int]:
    """``pid`` and every process below it (the daemons and ZooKeeper's JVM)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, stack = set(), [pid]
    while stack:
        p = stack.pop()
        out.add(p)
        stack.extend(children.get(p, []))
    return out


def socket_inodes(pids: set[int]) -> set[str]:
    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    return inodes


def listening(inodes: set[str]) -> list[tuple[str, int]]:
    """(address, port) of each listening TCP socket among ``inodes`` (IPv4 and IPv6)."""
    out = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        with open(table) as f:
            rows = f.read().splitlines()[1:]
        for row in rows:
            fields = row.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != LISTEN or inode not in inodes:
                continue
            address_hex, port_hex = local.split(":")
            raw = bytes.fromhex(address_hex)
            # The kernel prints each 32-bit word in host (little-endian) order.
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            out.append((socket.inet_ntop(family, raw), int(port_hex, 16)))
    return out


def loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)  # Java listens on ::ffff:127.0.0.1
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def test_waltz_local_up_is_tls_with_acls_and_only_on_loopback(tmp_path, zookeeper_available):
    data = tmp_path / "up"
    proc = subprocess.Popen(
        [
            *(
                sys.executable,
                "-m",
                "waltz_client.tools.cli",
                "local",
                "up",
                "--data-dir",
                str(data),
            ),
            *("--storages", "2", "--replicas", "2", "--partitions", "2", "--servers", "1"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "Ctrl-C stops everything" in line:
                break
        out = "".join(lines)
        assert "ready." in out, out
        # What a client and an admin need is printed.
        pki = data / "pki"
        assert f"cert {pki}/waltz-client.pem, key {pki}/waltz-client.key, CA {pki}/ca.pem" in out
        export = next(line for line in lines if "export " in line)
        assert f"WALTZ_ZK_AUTH_FILE={pki}/zk-auth" in export
        assert f"WALTZ_ZK_TLS_CERT={pki}/waltz-admin.pem" in export

        state = json.loads((data / "local.json").read_text())
        secure_port = int(export.split("WALTZ_ZOOKEEPER=")[1].split()[0].rsplit(":", 1)[1])
        expected = {state["zookeeper_port"], secure_port}
        expected.update(p for pair in state["storage_ports"] for p in pair)
        expected.update(p for pair in state["server_ports"] for p in pair)
        sockets = listening(socket_inodes(descendants(proc.pid)))
        assert expected <= {port for _, port in sockets}, (expected, sockets)
        assert all(loopback(address) for address, _ in sockets), sockets

        # The metadata is under ACLs: an anonymous session on the plain port (kept on
        # loopback for the launcher's probe) reads but cannot write.
        zk = connect(f"127.0.0.1:{state['zookeeper_port']}")
        try:
            with pytest.raises(NoAuthError):
                zk.set(ClusterPaths.of("/waltz").ownership, b"{}", version=10**6)
        finally:
            close(zk)
        # Mutual TLS: no daemon says it serves plain text, and a plain client's request
        # to the server gets no answer in kind (the TLS listener drops it).
        for name in ("storage-0", "storage-1", "server-0"):
            assert "PLAIN TEXT" not in (data / f"{name}.log").read_text(), name
        with socket.create_connection(("127.0.0.1", state["server_ports"][0][0]), 10) as s:
            s.settimeout(10)
            s.sendall(b"\x00\x00\x00\x08not-tls!")
            reply = s.recv(64)
        assert not reply or reply[:1] == b"\x15"  # closed, or a TLS alert record
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, "".join(lines) + rest


def test_insecure_and_tls_are_exclusive(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "waltz_client.tools.cli", "local", "up", "--tls", "--insecure"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 2 and "not allowed with" in result.stderr


def test_a_data_dir_kept_from_an_insecure_run_is_secured_and_not_opened_again(
    tmp_path, zookeeper_available
):
    def local(tls: bool) -> LocalCluster:
        return LocalCluster(
            str(tmp_path / "kept"), storages=1, partitions=1, replicas=1, servers=0, tls=tls
        )

    plain = local(tls=False)
    plain.start()
    plain.stop()
    messages: list[str] = []
    secured = local(tls=True)
    secured.start(messages.append)
    try:
        assert any("its metadata now has ACLs" in m for m in messages), messages
        zk = connect(f"127.0.0.1:{secured.layout.zookeeper_port}")  # anonymous, plain port
        try:
            for path in (
                "/waltz",
                "/waltz/cluster",
                "/waltz/ownership",
                "/waltz/store/partition/0",
            ):
                with pytest.raises(NoAuthError):
                    zk.set(path, b"", version=10**6)
        finally:
            close(zk)
    finally:
        secured.stop()
    with pytest.raises(LocalClusterError, match="without --insecure"):
        local(tls=False).start()
