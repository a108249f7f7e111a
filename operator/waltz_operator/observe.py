"""What the operator knows of a cluster's quorum state, from ZooKeeper and the servers'
``/metrics``. Pure: the monitor (monitor.py) does the reading.

ZooKeeper says what each partition should be (its replicas, owner, generation, the
members of its last writing session); the owning server's metrics say what it is (the
running store session's members, the high-water mark, each replica's lag). A partition
whose owner could not be scraped has no live replicas as far as the operator knows: it
never assumes a quorum it has not seen.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from waltz_client.cluster.admin import ClusterState
from waltz_client.cluster.metadata import key_fingerprint

from .rollout import PartitionState
from .status import PartitionObserved


@dataclass(frozen=True)
class ServerPartition:
    """One partition as its owning server reports it."""

    generation: int = 0
    session_id: int = -1
    high_water_mark: int = -1
    in_session: frozenset[str] = frozenset()  # replicas in the running store session
    lag: Mapping[str, int] = field(default_factory=dict)  # replica -> transactions behind


def _whole(value: float, what: str) -> int:
    """A sample's value as an integer; ValueError (not int()'s OverflowError) for an
    infinite one."""
    if not math.isfinite(value):
        raise ValueError(f"{what} is {value}")
    return int(value)


def parse_server_metrics(text: str) -> dict[int, ServerPartition]:
    """A server's ``/metrics`` text -> partition -> what it reports. Raises ValueError on
    text that is not the Prometheus exposition format (or holds impossible values)."""
    values: dict[int, dict[str, float]] = {}
    members: dict[int, set[str]] = {}
    lags: dict[int, dict[str, int]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "partition" not in sample.labels:
                continue
            p = int(sample.labels["partition"])
            replica = sample.labels.get("replica")
            if sample.name == "waltz_server_partition_replica_in_session" and replica:
                if sample.value == 1:
                    members.setdefault(p, set()).add(replica)
            elif sample.name == "waltz_server_partition_replica_lag" and replica:
                lags.setdefault(p, {})[replica] = _whole(sample.value, sample.name)
            elif replica is None:
                values.setdefault(p, {})[sample.name] = sample.value
    out: dict[int, ServerPartition] = {}
    for p in sorted(set(values) | set(members) | set(lags)):
        v = values.get(p, {})
        out[p] = ServerPartition(
            generation=_whole(v.get("waltz_server_partition_generation", 0), "generation"),
            session_id=_whole(v.get("waltz_server_partition_session_id", -1), "session_id"),
            high_water_mark=_whole(
                v.get("waltz_server_partition_high_water_mark", -1), "high_water_mark"
            ),
            in_session=frozenset(members.get(p, ())),
            lag=dict(lags.get(p, {})),
        )
    return out


@dataclass(frozen=True)
class PartitionView:
    partition: int
    assigned: tuple[str, ...]  # replicas in the assignment
    writing_members: frozenset[str]  # the last writing session's replicas (ZooKeeper)
    owner: str | None
    generation: int
    reported: ServerPartition | None  # None: the owner was not scraped (or has none)

    @property
    def live(self) -> frozenset[str]:
        """Replicas in the running store session, as the owner reports it."""
        return self.reported.in_session if self.reported is not None else frozenset()

    @property
    def quorum(self) -> bool:
        return len(self.live & set(self.assigned)) >= len(self.assigned) // 2 + 1

    @property
    def high_water_mark(self) -> int:
        return self.reported.high_water_mark if self.reported is not None else -1


@dataclass(frozen=True)
class ClusterView:
    """One cluster's quorum state at one moment."""

    root: str
    key: str
    name: str
    partitions: tuple[PartitionView, ...]
    servers: Mapping[str, str]  # server ID -> its HTTP endpoint (host:port)
    still_serving: Mapping[str, list[int]]
    storage_up: Mapping[str, bool] = field(default_factory=dict)  # address -> /readyz ok
    problems: tuple[str, ...] = ()  # metadata problems and failed scrapes

    def rollout_states(self) -> dict[int, PartitionState]:
        """For rollout.py: a replica counts as a member only while it is in the running
        store session (copied and taken in), as the owner reports it."""
        return {
            p.partition: PartitionState(assigned=frozenset(p.assigned), members=p.live)
            for p in self.partitions
        }

    def status_partitions(self) -> list[PartitionObserved]:
        return [
            PartitionObserved(
                partition=p.partition,
                owner=p.owner,
                generation=p.generation,
                live_replicas=len(p.live & set(p.assigned)),
                assigned_replicas=len(p.assigned),
                high_water_mark=p.high_water_mark,
            )
            for p in self.partitions
        ]


def combine(
    state: ClusterState,
    scrapes: Mapping[str, Mapping[int, ServerPartition]],
    storage_up: Mapping[str, bool] | None = None,
    scrape_errors: Mapping[str, str] | None = None,
) -> ClusterView:
    """ZooKeeper's view of the cluster joined with what its servers report (server ID ->
    partition -> report). A server's report on a partition counts only if it owns the
    partition with the generation ZooKeeper records (a deposed owner's is stale)."""
    partitions = []
    for p in range(state.params.num_partitions):
        owner, generation = state.ownership.partitions.get(p, (None, 0))
        report = scrapes.get(owner, {}).get(p) if owner is not None else None
        if report is not None and report.generation != generation:
            report = None
        partitions.append(
            PartitionView(
                partition=p,
                assigned=tuple(state.assignment.replicas_of(p)),
                writing_members=frozenset(state.members(p)),
                owner=owner,
                generation=generation,
                reported=report,
            )
        )
    errors = [f"server {s}: {e}" for s, e in sorted((scrape_errors or {}).items())]
    return ClusterView(
        root=state.root,
        key=key_fingerprint(state.params.key),
        name=state.params.name,
        partitions=tuple(partitions),
        servers={s: f"{r.host}:{r.http_port}" for s, r in sorted(state.servers.items())},
        still_serving=state.still_serving(),
        storage_up=dict(storage_up or {}),
        problems=(*state.problems, *errors),
    )
