"""A whole Waltz cluster on localhost: embedded ZooKeeper, CreateCluster, storage and
server processes.

State lives in one data directory and survives a restart: ``local.json``
records the ports chosen on the first start (the replica assignment names
storage nodes by ``host:port``, so they must not change), ZooKeeper keeps its
data in ``zookeeper/`` and each storage node in ``storage-<i>/``. Servers
keep nothing on disk; each has a fixed ID, ``server-<i>``.

With ``tls=True`` a throw-away CA in ``pki/`` issues a certificate per daemon
(``waltz-storage-<i>``, ``waltz-server-<i>``), one for admin tools (``waltz-admin``) and
one for clients (``waltz-client``, ``client_tls``); clients reach servers, and servers
storage nodes, over mutual TLS; and the metadata in ZooKeeper gets ACLs: only the
credential in ``pki/zk-auth`` (given to servers) may write it. ``waltz local up`` and
``waltz demo`` pass ``tls=True`` unless ``--insecure``; the class defaults to plain
because most tests use it as a harness and do not need the handshakes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import secrets
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from kazoo.security import OPEN_ACL_UNSAFE

from waltz_client.cluster.acl import client_ids_acl_of, credential_from_setting, metadata_acl
from waltz_client.cluster.admin import CreateResult, create_cluster
from waltz_client.cluster.paths import ClusterPaths
from waltz_client.cluster.secure import same_acl, secure_cluster
from waltz_client.cluster.zk import close, connect
from waltz_client.runtime.tls import TlsContexts, TlsFiles, tls_open_connection

from .certs import local_pki
from .processes import DaemonProcess
from .zookeeper import EmbeddedZooKeeper

log = logging.getLogger(__name__)
HOST = "127.0.0.1"
STATE_FILE = "local.json"
ADMIN_IDENTITY = "waltz-admin"  # admin tools' certificate, let into storage nodes
CLIENT_IDENTITY = "waltz-client"  # clients' certificate (the demo, tests)
ZOOKEEPER_IDENTITY = "waltz-zookeeper"  # the embedded ZooKeeper's TLS port


class LocalClusterError(RuntimeError):
    pass


@dataclass
class LocalLayout:
    """What a data directory was created with; later starts must agree."""

    name: str
    root: str
    partitions: int
    replicas: int
    zookeeper_port: int
    storage_ports: list[tuple[int, int]]  # (protocol, http) per storage node
    server_ports: list[tuple[int, int]] = field(default_factory=list)  # (client, http)

    @property
    def storage_addresses(self) -> list[str]:
        return [f"{HOST}:{port}" for port, _ in self.storage_ports]


def _usable_data_dir(path: str) -> None:
    """Create the data directory if need be and check that files can be written in it:
    else LocalClusterError, one line naming it and the system's reason (a path under
    /proc, a file, a directory this user may not write)."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise LocalClusterError(f"data directory {path}: not a directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise LocalClusterError(f"data directory {path}: cannot create it: {e.strerror}") from None
    try:  # a real write: access() says yes to root on a directory that refuses files
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise LocalClusterError(
            f"data directory {path}: cannot write in it: {e.strerror}"
        ) from None


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
            return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _port_range() -> tuple[int, int]:
    """Where ports are picked: the 12,000 below the kernel's ephemeral range, or the
    ``i``-th of ``n`` slices of them with ``WALTZ_PORT_SLICE=i/n``. Processes that start
    clusters at the same time (parallel test workers) use disjoint slices: a port is
    free when picked but bound only when its daemon starts, so two pickers could
    otherwise both take it."""
    low, _ = _ephemeral_range()
    first, last = max(1024, low - 12000), max(1025, low - 1)
    given = os.environ.get("WALTZ_PORT_SLICE", "")
    if given:
        try:
            index, count = (int(x) for x in given.split("/"))
        except ValueError:
            raise LocalClusterError(f"WALTZ_PORT_SLICE={given!r}: expected i/n, as 0/2") from None
        if not 0 <= index < count:
            raise LocalClusterError(f"WALTZ_PORT_SLICE={given!r}: need 0 <= i < n")
        width = (last - first) // count
        first += index * width
        last = first + width
    return first, last


def _free_port(taken: set[int]) -> int:
    """A free port below the kernel's ephemeral range, not in ``taken`` (which it joins):
    the ports are kept across restarts (the replica assignment names storage nodes by
    host:port), and a port from the ephemeral range may meanwhile become some outgoing
    connection's source port. ``taken``: ports already picked for this cluster (each is
    free again once picked, so a second pick could return it)."""
    first, last = _port_range()
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(first, last)
        if port in taken:
            continue
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((HOST, port))
            except OSError:
                continue
            taken.add(port)
            return port
    while True:  # no luck below the range: any free port
        with socket.socket() as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        if port not in taken:
            taken.add(port)
            return port


class LocalCluster:
    def __init__(
        self,
        data_dir: str,
        *,
        storages: int = 3,
        partitions: int = 4,
        replicas: int = 3,
        name: str = "local",
        root: str = "/waltz",
        storage_args: list[str] | None = None,
        servers: int = 2,
        server_args: list[str] | None = None,
        external_zookeeper: str | None = None,
        tls: bool = False,
        zk_auth_file: str = "",
    ) -> None:
        """``external_zookeeper``: use that ensemble (tests share one) instead of starting
        an embedded ZooKeeper. ``tls``: servers and storage nodes talk over mutual TLS,
        and the metadata gets ACLs (a credential made in ``pki/``). ``zk_auth_file``
        (without ``tls``): servers and ``zk_connect`` authenticate with that credential
        but the cluster is created open, as one made before it had ACLs
        (``waltz cluster secure`` adds them)."""
        if tls and zk_auth_file:
            raise LocalClusterError("tls makes its own ZooKeeper credential: no zk_auth_file")
        self.data_dir = os.path.abspath(data_dir)
        self.storage_args = storage_args or []
        self.server_args = server_args or []
        self.layout = self._load_or_plan(storages, partitions, replicas, name, root)
        self._plan_servers(servers)
        self.pki: dict[str, TlsFiles] | None = None
        if tls:
            hosts = [HOST, "localhost"]
            identities = {ADMIN_IDENTITY: hosts, CLIENT_IDENTITY: hosts, ZOOKEEPER_IDENTITY: hosts}
            identities.update({f"waltz-storage-{i}": hosts for i in range(storages)})
            identities.update({f"waltz-server-{i}": hosts for i in range(servers)})
            try:
                self.pki = local_pki(os.path.join(self.data_dir, "pki"), identities)
            except ImportError as e:
                raise LocalClusterError(
                    f"a TLS local cluster makes its throw-away CA with trustme ({e}): "
                    f"pip install 'waltz[local]', or run with --insecure (plain text)"
                ) from None
        # A secure cluster also keeps its metadata under ZooKeeper ACLs (acl.py).
        self.zk_auth_file = os.path.join(self.data_dir, "pki", "zk-auth") if tls else zk_auth_file
        self.create_open = bool(zk_auth_file)
        if self.zk_auth_file and not os.path.exists(self.zk_auth_file):
            with open(os.open(self.zk_auth_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
                f.write(f"waltz:{secrets.token_urlsafe(24)}\n")
        self.zk_credential = credential_from_setting(self.zk_auth_file, "zk_auth_file")
        self.external_zookeeper = external_zookeeper
        self.zookeeper: EmbeddedZooKeeper | None = None
        if external_zookeeper is None:
            self.zookeeper = EmbeddedZooKeeper(
                os.path.join(self.data_dir, "zookeeper"),
                port=self.layout.zookeeper_port,
                host=HOST,
                tls=self.pki[ZOOKEEPER_IDENTITY] if self.pki is not None else None,
            )
        self.storages = [self._storage_process(i) for i in range(len(self.layout.storage_ports))]
        self.servers = [self._server_process(i) for i in range(servers)]
        self.created: CreateResult | None = None

    def _load_or_plan(
        self, storages: int, partitions: int, replicas: int, name: str, root: str
    ) -> LocalLayout:
        _usable_data_dir(self.data_dir)
        path = os.path.join(self.data_dir, STATE_FILE)
        if os.path.exists(path):
            with open(path) as f:
                doc = json.load(f)
            layout = LocalLayout(
                **{
                    **doc,
                    "storage_ports": [tuple(p) for p in doc["storage_ports"]],
                    "server_ports": [tuple(p) for p in doc.get("server_ports", [])],
                }
            )
            wanted = (name, root, partitions, replicas, storages)
            have = (
                layout.name,
                layout.root,
                layout.partitions,
                layout.replicas,
                len(layout.storage_ports),
            )
            if wanted != have:
                raise LocalClusterError(
                    f"{self.data_dir} holds a local cluster made with name, root, partitions, "
                    f"replicas, storages = {have}, not {wanted}; use those settings or "
                    f"another --data-dir"
                )
            return layout
        if not 1 <= replicas <= storages:
            raise LocalClusterError(f"{replicas} replicas need 1..{storages} storage nodes")
        taken: set[int] = set()
        layout = LocalLayout(
            name,
            root,
            partitions,
            replicas,
            _free_port(taken),
            [(_free_port(taken), _free_port(taken)) for _ in range(storages)],
        )
        with open(path, "w") as f:
            json.dump(asdict(layout), f, indent=2)
        return layout

    def _plan_servers(self, servers: int) -> None:
        """Servers may be added to an existing directory: ports are kept per index."""
        if servers < 0:
            raise LocalClusterError(f"servers must be >= 0, got {servers}")
        if len(self.layout.server_ports) < servers:
            taken = {self.layout.zookeeper_port}
            taken.update(p for pair in self.layout.storage_ports for p in pair)
            taken.update(p for pair in self.layout.server_ports for p in pair)
            while len(self.layout.server_ports) < servers:
                self.layout.server_ports.append((_free_port(taken), _free_port(taken)))
            with open(os.path.join(self.data_dir, STATE_FILE), "w") as f:
                json.dump(asdict(self.layout), f, indent=2)

    def _daemon(
        self, name: str, module: str, ports: tuple[int, int], args: list[str]
    ) -> DaemonProcess:
        """A daemon on localhost following this cluster's ZooKeeper, logging and writing
        its ready file in the data directory."""
        port, http_port = ports
        ready = os.path.join(self.data_dir, f"{name}.ready")
        command = [
            sys.executable,
            "-m",
            module,
            "--zookeeper",
            self.zookeeper_connect,
            "--zk-root",
            self.layout.root,
            "--host",
            HOST,
            "--port",
            str(port),
            "--http-port",
            str(http_port),
            "--ready-file",
            ready,
            *args,
        ]
        return DaemonProcess(name, command, ready, os.path.join(self.data_dir, f"{name}.log"))

    def _tls_args(self, identity: str, prefix: str) -> list[str]:
        if self.pki is None:
            return []
        files = self.pki[identity]
        return [
            f"--{prefix}-cert",
            str(files.cert),
            f"--{prefix}-key",
            str(files.key),
            f"--{prefix}-ca",
            str(files.ca),
        ]

    def _zk_tls_args(self, identity: str) -> list[str]:
        files = self.zk_tls(identity)
        if files is None:
            return []
        return [
            "--zk-tls-cert",
            str(files.cert),
            "--zk-tls-key",
            str(files.key),
            "--zk-tls-ca",
            str(files.ca),
        ]

    def _server_process(self, i: int) -> DaemonProcess:
        return self._daemon(
            f"server-{i}",
            "waltz_server.main",
            self.layout.server_ports[i],
            [
                "--server-id",
                f"server-{i}",
                *(["--zk-auth-file", self.zk_auth_file] if self.zk_auth_file else []),
                *self._zk_tls_args(f"waltz-server-{i}"),
                *self._tls_args(f"waltz-server-{i}", "tls"),
                *self._tls_args(f"waltz-server-{i}", "storage-tls"),
                *self.server_args,
            ],
        )

    def _storage_process(self, i: int) -> DaemonProcess:
        tls = self._tls_args(f"waltz-storage-{i}", "tls")
        if tls:
            tls += ["--tls-allowed-peers", f"waltz-server-*,{ADMIN_IDENTITY}"]
        return self._daemon(
            f"storage-{i}",
            "waltz_storage.main",
            self.layout.storage_ports[i],
            [
                "--directory",
                os.path.join(self.data_dir, f"storage-{i}"),
                *self._zk_tls_args(f"waltz-storage-{i}"),
                *tls,
                *self.storage_args,
            ],
        )

    @property
    def client_tls(self) -> TlsFiles | None:
        """What a client of this cluster passes as ``WaltzClientConfig.tls``."""
        return self.pki[CLIENT_IDENTITY] if self.pki is not None else None

    def client_open_connection(self) -> Callable[..., Any]:
        """How a raw client (tests, tools) reaches this cluster's servers."""
        if self.client_tls is None:
            return asyncio.open_connection
        return tls_open_connection(TlsContexts(self.client_tls, listening=False))

    def storage_open_connection(self) -> Callable[..., Any]:
        """How admin tools reach this cluster's storage nodes (as ``waltz-admin`` with TLS)."""
        if self.pki is None:
            return asyncio.open_connection
        return tls_open_connection(TlsContexts(self.pki[ADMIN_IDENTITY], listening=False))

    def ownership(self) -> dict[int, tuple[str | None, int]]:
        """partition -> (owning server ID or None, generation), as ZooKeeper has it now."""
        from waltz_client.cluster.admin import read_cluster

        zk = self.zk_connect()
        try:
            return read_cluster(zk, self.layout.root).ownership.partitions
        finally:
            close(zk)

    def owner_index(
        self, partition: int, not_server: str | None = None, timeout: float = 30.0
    ) -> tuple[int, int]:
        """(index in ``servers``, generation) of the partition's owner, once it has one
        (other than ``not_server``, for waiting out a failover)."""
        deadline = time.monotonic() + timeout
        while True:
            owner, generation = self.ownership().get(partition, (None, 0))
            if owner is not None and owner != not_server and owner.startswith("server-"):
                return int(owner.split("-", 1)[1]), generation
            if time.monotonic() > deadline:
                raise LocalClusterError(f"partition {partition} has no owner after {timeout:g} s")
            time.sleep(0.1)

    @property
    def zookeeper_connect(self) -> str:
        """Where daemons and clients reach ZooKeeper: its TLS port when it has one."""
        if self.external_zookeeper is not None:
            return self.external_zookeeper
        if self.zookeeper is not None and self.zookeeper.tls is not None:
            return self.zookeeper.secure_connect_string
        return f"{HOST}:{self.layout.zookeeper_port}"

    def zk_tls(self, identity: str = ADMIN_IDENTITY) -> TlsFiles | None:
        """The files ``identity`` reaches this cluster's ZooKeeper with (None: plain)."""
        if self.pki is None or self.zookeeper is None or self.zookeeper.tls is None:
            return None
        return self.pki[identity]

    @property
    def client_zk_tls(self) -> TlsFiles | None:
        """What a client of this cluster passes as ``WaltzClientConfig.zk_tls``."""
        return self.zk_tls(CLIENT_IDENTITY)

    def zk_connect(self) -> Any:
        """A kazoo client on this cluster's ZooKeeper, as admin tools reach it."""
        return connect(self.zookeeper_connect, credential=self.zk_credential, tls=self.zk_tls())

    def start(self, progress: Callable[[str], None] = lambda message: None) -> None:
        try:
            if self.zookeeper is not None:
                progress(f"starting ZooKeeper on {self.zookeeper_connect}")
                self.zookeeper.start()
            zk = (
                connect(self.zookeeper_connect, tls=self.zk_tls())  # anonymous: open ACLs
                if self.create_open
                else self.zk_connect()
            )
            try:
                self.created = create_cluster(
                    zk,
                    self.layout.root,
                    self.layout.name,
                    self.layout.partitions,
                    self.layout.replicas,
                    self.layout.storage_addresses,
                )
                verb = "created" if self.created.created else "found"
                progress(
                    f"{verb} cluster {self.layout.name!r} at {self.layout.root}: "
                    f"{self.layout.partitions} partitions x {self.layout.replicas} replicas"
                )
                if self.zookeeper is not None and not self.created.created:
                    self._match_acl(zk, progress)
            finally:
                close(zk)
            for proc in self.storages:
                proc.start()
                progress(
                    f"{proc.name} serving on {HOST}:{proc.ready['port']} "
                    f"(http {proc.ready['http_port']})"
                )
            for proc in self.servers:
                proc.start()
                progress(
                    f"{proc.name} serving clients on {HOST}:{proc.ready['port']} "
                    f"(http {proc.ready['http_port']})"
                )
        except BaseException:
            self.stop()
            raise

    def _match_acl(self, zk: Any, progress: Callable[[str], None]) -> None:
        """A data directory kept from an earlier run whose metadata does not match this
        run's security: an open cluster is secured (before any server starts); a cluster
        with ACLs is refused without a credential (its servers could not write)."""
        acl, _ = zk.get_acls(ClusterPaths.of(self.layout.root).cluster)
        is_open = same_acl(acl, OPEN_ACL_UNSAFE)
        if self.pki is not None and is_open:
            secure_cluster(
                zk,
                self.layout.root,
                metadata_acl(self.zk_credential),
                client_ids_acl_of(zk) or metadata_acl(self.zk_credential),
                force=True,  # no server of ours runs yet; an old one's session is ending
                settle=0.0,
            )
            progress("the cluster found was open (made with --insecure): its metadata now has ACLs")
        elif self.zk_credential is None and not is_open:
            raise LocalClusterError(
                f"the cluster in {self.data_dir} keeps its metadata under ZooKeeper ACLs "
                f"(it was made without --insecure): start it without --insecure, or use "
                f"another --data-dir"
            )

    def stop(self) -> None:
        for proc in self.servers:
            proc.stop()
        for proc in self.storages:
            proc.stop()
        if self.zookeeper is not None:
            self.zookeeper.stop()

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
