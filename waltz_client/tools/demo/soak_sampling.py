"""What ``waltz soak`` samples: the resident memory of every process of the run, each
partition's log start and disk use on each storage node, the servers' caches as they count
them, and the machine it ran on. Figures are recorded in MB (``mb``).
"""

from __future__ import annotations

import os
import platform
import urllib.request
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient

from waltz_client.cluster import admin
from waltz_client.tools.local.cluster import HOST, LocalCluster
from waltz_client.tools.local.processes import DaemonProcess

MB = 1_000_000
LOAD = "load"  # this process: the producer and the consumers

Disk = tuple[list[int], list[int]]  # (bytes, segment files) on each storage node


def mb(n: int | None) -> float | None:
    return None if n is None else round(n / MB, 1)


def rss_bytes(pid: int | None) -> int | None:
    """VmRSS of ``pid`` (None: not running)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def cluster_processes(cluster: LocalCluster) -> list[tuple[str, Callable[[], int | None]]]:
    """(name, its pid now) of every process of the run; ``load`` is this one."""
    procs: list[tuple[str, Callable[[], int | None]]] = []
    zk = cluster.zookeeper
    if zk is not None:
        procs.append(("zookeeper", lambda: zk.pid))
    for d in [*cluster.storages, *cluster.servers]:
        procs.append((d.name, lambda d=d: d.pid if d.running else None))
    procs.append((LOAD, os.getpid))
    return procs


def partition_disk(cluster: LocalCluster, p: int) -> Disk:
    """(bytes, segment files) of partition ``p`` on each storage node."""
    sizes, segments = [], []
    for i in range(len(cluster.storages)):
        total = count = 0
        try:
            with os.scandir(os.path.join(cluster.data_dir, f"storage-{i}", str(p))) as it:
                for entry in it:
                    try:
                        total += entry.stat().st_size
                    except OSError:  # deleted by retention as we looked
                        continue
                    count += entry.name.endswith(".seg")
        except OSError:
            pass
        sizes.append(total)
        segments.append(count)
    return sizes, segments


def server_cache_bytes(server: DaemonProcess) -> int | None:
    """What the server's feed and data caches hold now, as it counts them (its
    ``waltz_server_memory_cache_bytes`` metric; None if it does not answer on plain
    HTTP)."""
    port = server.ready.get("http_port") if server.running else None
    if not port:
        return None
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("waltz_server_memory_cache_bytes "):
                    return int(float(line.split()[1]))
    except (OSError, ValueError):
        return None
    return None


def cluster_state(
    zk: KazooClient, cluster: LocalCluster, partitions: int
) -> tuple[dict[int, int], dict[int, Disk], dict[str, float | None]]:
    """Blocking: each partition's log start (from its metadata in ZooKeeper; none if that
    cannot be read), its disk use, and each server's caches (MB)."""
    try:
        state = admin.read_cluster(zk, cluster.layout.root)
        starts = {p: m.log_start for p, m in state.partitions.items()}
    except Exception:
        starts = {}
    disk = {p: partition_disk(cluster, p) for p in range(partitions)}
    caches = {d.name: mb(server_cache_bytes(d)) for d in cluster.servers}
    return starts, disk, caches


def machine() -> dict[str, Any]:
    """The machine the run was on."""
    mem = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem = round(int(line.split()[1]) / 1024**2, 1)
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "arch": platform.machine(),
        "memory_gib": mem,
        "python": platform.python_version(),
    }
