"""``waltz fuzz`` against a whole local cluster: its first storage node, then its first
server (``connections``), then a well-behaved client (``client_check``), and the error
lines the daemons logged meanwhile.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from .client_check import ClientCheck, check_client
from .connections import Endpoint, FuzzStats, TlsDial, fuzz_target
from .frames import FuzzTarget
from .report import describe_stats, every_ten_probes

if TYPE_CHECKING:
    from waltz_client.tools.local.cluster import LocalCluster

_LOG_ALARMS = ("Traceback", " ERROR ", " CRITICAL ")


@dataclass
class ClusterFuzzResult:
    stats: list[FuzzStats]
    check: ClientCheck
    dead: list[str]  # daemons of the cluster that exited
    logged_errors: dict[str, list[str]]  # daemon: error lines it logged while fuzzed

    @property
    def ok(self) -> bool:
        return not self.dead and self.check.ok and not any(s.failed for s in self.stats)


def _log_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _new_error_lines(path: str, offset: int) -> list[str]:
    """Error lines (and tracebacks) a daemon logged after ``offset``: not fatal, but an
    exception the fuzzer provoked is a finding."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if any(a in line for a in _LOG_ALARMS)]


async def fuzz_cluster(
    cluster: LocalCluster,
    *,
    frames: int,
    seed: int,
    concurrency: int = 16,
    reply_timeout: float = 0.5,
    client_transactions: int = 8,
    replay_sessions: bool = True,
    announce: Callable[[str], None] = lambda line: None,
) -> ClusterFuzzResult:
    """Fuzz a started local cluster's first storage node, then its first server, then
    check that a client of the cluster appends and reads back. ``replay_sessions``: see
    ``FuzzTarget``. On a TLS cluster the fuzzer dials storage with the admin certificate
    and the server with the client's, and also sends mutated handshakes."""
    from waltz_client.tools.local.cluster import ADMIN_IDENTITY

    assert cluster.created is not None, "start the cluster first"
    num_partitions = cluster.layout.partitions
    key = cluster.created.params.key
    storage_tls = server_tls = None
    if cluster.pki is not None and cluster.client_tls is not None:
        storage_tls = TlsDial.of(cluster.pki[ADMIN_IDENTITY], "127.0.0.1")
        server_tls = TlsDial.of(cluster.client_tls, "127.0.0.1")
    runs = [
        (
            cluster.storages[0],
            storage_tls,
            FuzzTarget("storage", num_partitions, key, replay_sessions),
        ),
        (cluster.servers[0], server_tls, FuzzTarget("server", num_partitions)),
    ]
    daemons = [*cluster.storages, *cluster.servers]
    offsets = {d.name: _log_size(d.log_path) for d in daemons}
    results: list[FuzzStats] = []
    for proc, tls, target in runs:
        if tls is not None:
            target = replace(target, tls_hello=tls.client_hello())
        endpoint = Endpoint(
            proc.name,
            "127.0.0.1",
            int(proc.ready["port"]),
            proc.pid,
            alive=lambda proc=proc: proc.running,
            tls=tls,
        )
        announce(f"fuzzing {proc.name} (pid {proc.pid}): {frames:,} frames, seed {seed}")
        stats = await fuzz_target(
            endpoint,
            target,
            seed=seed,
            frames=frames,
            concurrency=concurrency,
            reply_timeout=reply_timeout,
            progress=every_ten_probes(announce),
        )
        results.append(stats)
        announce("\n".join(describe_stats(stats)))
    check = await check_client(
        cluster.zookeeper_connect,
        cluster.layout.root,
        client_transactions,
        tls=cluster.client_tls,
        zk_tls=cluster.client_zk_tls,
    )
    errors = {d.name: _new_error_lines(d.log_path, offsets[d.name]) for d in daemons}
    return ClusterFuzzResult(
        results,
        check,
        [d.name for d in daemons if not d.running],
        {name: lines for name, lines in errors.items() if lines},
    )
