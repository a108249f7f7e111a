"""Where each piece of cluster metadata lives under the cluster root."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..runtime.settings import text


def normalise_root(root: str) -> str:
    """``/waltz/prod`` form: leading slash, no trailing slash, no empty or dot segments."""
    parts = [p for p in root.strip().split("/") if p]
    if not parts:
        raise ValueError("the cluster root must name a znode below /, such as /waltz")
    for p in parts:
        if p in (".", "..") or (p == "zookeeper" and parts[0] == "zookeeper"):
            raise ValueError(f"the cluster root {root!r} has a reserved segment {p!r}")
    return "/" + "/".join(parts)


def znode_root(value: Any) -> str:
    """The ``zk_root`` setting: a cluster root such as /waltz, normalised (ValueError names
    what is wrong)."""
    return normalise_root(text(value))


@dataclass(frozen=True)
class ClusterPaths:
    root: str

    @classmethod
    def of(cls, root: str) -> ClusterPaths:
        return cls(normalise_root(root))

    @property
    def cluster(self) -> str:
        """Cluster parameters: name, key, partition and replica counts."""
        return f"{self.root}/cluster"

    @property
    def store(self) -> str:
        return f"{self.root}/store"

    @property
    def assignment(self) -> str:
        """Replica assignment: storage node -> partitions (the spec's store/assignment)."""
        return f"{self.root}/store/assignment"

    @property
    def partitions(self) -> str:
        return f"{self.root}/store/partition"

    def partition(self, partition_id: int) -> str:
        """Partition metadata: generation, store session, replica states."""
        return f"{self.root}/store/partition/{partition_id}"

    @property
    def servers(self) -> str:
        """Live servers register ephemeral children here."""
        return f"{self.root}/servers"

    def server(self, server_id: str) -> str:
        return f"{self.root}/servers/{server_id}"

    @property
    def ownership(self) -> str:
        """Partition -> owning server, with a generation per partition."""
        return f"{self.root}/ownership"

    @property
    def access(self) -> str:
        """Which client identities may read or append which partitions (optional)."""
        return f"{self.root}/access"

    @property
    def retention(self) -> str:
        """How much of each partition's log to keep (optional: without it, everything)."""
        return f"{self.root}/retention"

    @property
    def replacements(self) -> str:
        """Storage nodes being replaced, and the latest steps (``replace_storage``)."""
        return f"{self.root}/store/replacements"

    @property
    def client_bindings(self) -> str:
        """Client ID -> the certificate identity it was allocated to (with client TLS); a
        binding's modification time is its last use (``client_ids``)."""
        return f"{self.root}/client-bindings"

    def client_binding(self, client_id: int) -> str:
        return f"{self.root}/client-bindings/{client_id}"

    @property
    def client_identities(self) -> str:
        """Per identity, its live client IDs as children (what its quota counts)."""
        return f"{self.root}/client-identities"

    def client_identity(self, key: str) -> str:
        """``key``: ``client_ids.identity_key(identity)``."""
        return f"{self.root}/client-identities/{key}"

    @property
    def client_ids(self) -> str:
        """Parent of sequential nodes whose sequence numbers are unique client IDs (servers
        draw them; a cluster created before AllocateClientId lets anyone draw)."""
        return f"{self.root}/client-ids"
