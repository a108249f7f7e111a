"""What the demo, the smoke test and the benchmark share: argument checks and a fresh
local cluster."""

from __future__ import annotations

import argparse
import shutil

from ..local.cluster import LocalCluster

# A dead server's partitions move once its ZooKeeper session expires: keep that short.
FAST_FAILOVER = ["--zk-session-timeout", "4"]


def check_at_least_one(prog: str, args: argparse.Namespace, *names: str) -> bool:
    """Print a one-line error (and return False) for the first of ``names`` below 1."""
    for name in names:
        if getattr(args, name) < 1:
            print(f"{prog}: error: --{name.replace('_', '-')} must be at least 1")
            return False
    return True


def fresh_cluster(
    data_dir: str, partitions: int, servers: int, server_args: list[str]
) -> LocalCluster:
    """A local cluster (3 storage nodes, 3 replicas) in ``data_dir``, wiped first."""
    shutil.rmtree(data_dir, ignore_errors=True)
    return LocalCluster(
        data_dir,
        storages=3,
        partitions=partitions,
        replicas=3,
        servers=servers,
        server_args=server_args,
    )
