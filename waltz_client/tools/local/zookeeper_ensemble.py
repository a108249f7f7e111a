"""A ZooKeeper ensemble on this host: N members in child JVMs forming one quorum.

``waltz bench --compare`` measures ZooKeeper as issue 16 did, with 3 replicas like a
waltz partition: a write commits once a majority of the members has logged it (each
fsyncs its transaction log). Each member is an ``EmbeddedZooKeeper`` with its own data
directory, client port, and quorum and election ports (``server.N`` lines, ``myid``).
"""

from __future__ import annotations

import os
import time

from .cluster import _free_port
from .zookeeper import EmbeddedZooKeeper, ZooKeeperUnavailable


class ZooKeeperEnsemble:
    def __init__(
        self, data_dir: str, members: int = 3, host: str = "127.0.0.1", heap_mb: int = 256
    ) -> None:
        if members < 1:
            raise ValueError(f"an ensemble has at least 1 member, not {members}")
        taken: set[int] = set()
        ports = [(_free_port(taken), _free_port(taken), _free_port(taken)) for _ in range(members)]
        quorum = None
        if members > 1:
            quorum = {i + 1: f"{host}:{qp}:{ep}" for i, (_, qp, ep) in enumerate(ports)}
        self.members = [
            EmbeddedZooKeeper(
                os.path.join(data_dir, f"member-{i + 1}"),
                client_port,
                host,
                heap_mb=heap_mb,
                server_id=i + 1 if quorum else 0,
                quorum=quorum,
            )
            for i, (client_port, _, _) in enumerate(ports)
        ]

    @property
    def connect_string(self) -> str:
        """Every member's ``host:port``: a client picks one, writes go to the leader."""
        return ",".join(m.connect_string for m in self.members)

    @property
    def pids(self) -> list[int]:
        return [m.pid for m in self.members if m.pid is not None]

    def start(self, timeout: float = 60.0) -> None:
        """Start every member, then wait until each serves (a quorum formed). On failure,
        stop them all and raise ZooKeeperUnavailable."""
        deadline = time.monotonic() + timeout
        try:
            for member in self.members:
                member.start(timeout, wait=False)
            for member in self.members:
                member.wait_ready(max(0.1, deadline - time.monotonic()))
        except (ZooKeeperUnavailable, OSError):
            self.stop()
            raise

    def stop(self) -> None:
        for member in self.members:
            member.stop()

    def __enter__(self) -> ZooKeeperEnsemble:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
