"""Prometheus metrics of a server, in a registry of its own; per-partition state is read at
scrape time, through ``ObservedServer`` (the server holds its metrics, not the reverse)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sized
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .memory_budget import PartitionBounds
from .partition import Partition
from .storage_replacer import ReplacementView

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


class MemoryBudgetSetting(Protocol):
    @property
    def memory_budget_bytes(self) -> int: ...


class ObservedServer(Protocol):
    """What the metrics read of a server at scrape time (server.py's WaltzServer)."""

    @property
    def partitions(self) -> Mapping[int, Partition]: ...

    @property
    def config(self) -> MemoryBudgetSetting: ...

    @property
    def bounds(self) -> PartitionBounds: ...

    @property
    def storage_pool(self) -> Sized: ...

    @property
    def replacement_view(self) -> ReplacementView | None: ...


class ServerMetrics:
    def __init__(self, server: ObservedServer) -> None:
        self.registry = CollectorRegistry()
        # process_*: CPU, resident memory, open files and their limit (/proc/self).
        ProcessCollector(registry=self.registry)
        self.connections = Counter(
            "waltz_server_connections", "Client connections accepted", registry=self.registry
        )
        self.client_errors = Counter(
            "waltz_server_client_errors",
            "Client requests refused or connections closed, by kind (malformed, limit, "
            "timeout, unauthorized, forbidden, ...)",
            ["kind"],
            registry=self.registry,
        )
        self.commit_seconds = Histogram(
            "waltz_server_commit_seconds",
            "From sending a batch to storage to its quorum acknowledgement",
            ["partition"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        storage_connections = Gauge(
            "waltz_server_storage_connections",
            "Open connections to storage nodes shared by the partitions' store sessions "
            "(one a node; 0 with shared_storage_connections off)",
            registry=self.registry,
        )
        storage_connections.set_function(lambda: len(server.storage_pool))
        self.registry.register(_PartitionCollector(server))
        self.registry.register(_MemoryCollector(server))
        self.registry.register(_ReplacementCollector(server))


class _ReplacementCollector(Collector):
    """Storage replacement (storage_replacer.py), on the assigner with
    replace_storage_after set; nothing elsewhere."""

    def __init__(self, server: ObservedServer) -> None:
        self._server = server

    def collect(self) -> Iterator[Metric]:
        view = self._server.replacement_view
        if view is None:
            return
        unreachable = GaugeMetricFamily(
            "waltz_server_storage_unreachable_seconds",
            "How long each storage node of the assignment has failed every probe (0: it "
            "answers); on the assigner",
            labels=["storage"],
        )
        for address, seconds in sorted(view.unreachable_seconds.items()):
            unreachable.add_metric([address], seconds)
        replacing = GaugeMetricFamily(
            "waltz_server_storage_replacing",
            "1 for each storage node being replaced (recorded in ZooKeeper); on the assigner",
            labels=["storage"],
        )
        for address in sorted(view.replacing):
            replacing.add_metric([address], 1)
        steps = CounterMetricFamily(
            "waltz_server_storage_replacement_steps",
            "Replacement steps this server took, by action: assigned and unassigned count "
            "partitions; removed and cancelled count nodes",
            labels=["action"],
        )
        for action in ("assigned", "unassigned", "removed", "cancelled"):
            steps.add_metric([action], view.steps.get(action, 0))
        yield unreachable
        yield replacing
        yield steps


class _MemoryCollector(Collector):
    """The memory budget (memory_budget.py): the budget, what the owned partitions may
    hold within it, and what their caches hold now."""

    def __init__(self, server: ObservedServer) -> None:
        self._server = server

    def collect(self) -> Iterator[Metric]:
        server = self._server
        partitions = list(server.partitions.values())
        values = {
            "budget_bytes": (
                "memory_budget_bytes: what the owned partitions' caches and backlogs may "
                "hold together",
                server.config.memory_budget_bytes,
            ),
            "bounded_bytes": (
                "What the owned partitions may hold at most (caches as sized by the budget, "
                "and backlogs)",
                server.bounds.total * len(partitions),
            ),
            "cache_limit_bytes": (
                "Each owned partition's feed and data cache bound, after the budget",
                server.bounds.feed_cache_bytes + server.bounds.data_cache_bytes,
            ),
            "cache_bytes": (
                "Bytes the owned partitions' caches hold now",
                sum(p.data_cache.bytes + p.feed_cache.bytes for p in partitions),
            ),
        }
        for name, (doc, value) in values.items():
            yield GaugeMetricFamily(f"waltz_server_memory_{name}", doc, value=value)


class _PartitionCollector(Collector):
    def __init__(self, server: ObservedServer) -> None:
        self._server = server

    def collect(self) -> Iterator[Metric]:
        gauges = {
            "high_water_mark": "Highest committed transaction ID (-1: none)",
            "generation": "Generation this server owns the partition with",
            "session_id": "Current store session ID (-1 while recovering)",
            "live_replicas": "Replicas in the current store session",
            "replicas": "Replicas assigned to the partition",
            "quorum": "1 when the store session holds a write quorum",
            "active": "1 when the partition accepts appends, 0 while recovering",
            "queue_size": "Appends, mounts and flushes waiting for the append task",
            "feed_clients": "Feeds (mounts and feed requests) being served",
            "mounted_clients": "Client IDs mounted on an open connection (their newest "
            "mount is remembered)",
            "data_cache_bytes": "Bytes in the transaction data cache",
            "log_start": "First transaction still served (retention deleted what is below)",
        }
        counters = {
            "appended": "Appends given a transaction ID",
            "committed": "Transactions committed by a storage quorum",
            "lock_failures": "Appends rejected by the lock table",
            "ignored": "Appends ignored (stale generation or connection)",
            "sessions": "Store sessions opened",
            "feed_sent": "Transaction headers sent on feeds",
            "data_cache_hits": "Transaction data requests served from the cache",
            "data_cache_misses": "Transaction data requests read from storage",
        }
        g = {
            n: GaugeMetricFamily(f"waltz_server_partition_{n}", d, labels=["partition"])
            for n, d in gauges.items()
        }
        c = {
            n: CounterMetricFamily(f"waltz_server_partition_{n}", d, labels=["partition"])
            for n, d in counters.items()
        }
        for p, part in sorted(self._server.partitions.items()):
            label = [str(p)]
            session = part.session
            live = session.live_replicas if session is not None else 0
            values = {
                "high_water_mark": part.high_water_mark,
                "generation": part.generation,
                "session_id": session.session_id if session is not None else -1,
                "live_replicas": live,
                "replicas": len(part.context.replicas),
                "quorum": 1 if live >= len(part.context.replicas) // 2 + 1 else 0,
                "active": 1 if part.healthy else 0,
                "queue_size": part.queue_size,
                "feed_clients": len(part.subscriptions),
                "mounted_clients": part.mounted_clients,
                "data_cache_bytes": part.data_cache.bytes,
                "log_start": part.log_start,
            }
            for n, v in values.items():
                g[n].add_metric(label, v)
            s = part.stats
            for n, v in (
                ("appended", s.appended),
                ("committed", s.committed),
                ("lock_failures", s.lock_failures),
                ("ignored", s.ignored),
                ("sessions", s.sessions),
                ("feed_sent", part.feed_sent),
                ("data_cache_hits", part.data_cache.hits),
                ("data_cache_misses", part.data_cache.misses),
            ):
                c[n].add_metric(label, v)
        in_session = GaugeMetricFamily(
            "waltz_server_partition_replica_in_session",
            "1 when the replica is a member of the partition's running store session",
            labels=["partition", "replica"],
        )
        lag = GaugeMetricFamily(
            "waltz_server_partition_replica_lag",
            "Committed transactions the replica does not hold yet (absent: unknown)",
            labels=["partition", "replica"],
        )
        for p, part in sorted(self._server.partitions.items()):
            for address, (member, held) in sorted(part.replica_positions().items()):
                in_session.add_metric([str(p), address], 1 if member else 0)
                if held is not None:
                    lag.add_metric([str(p), address], max(0, part.high_water_mark - held))
        yield from g.values()
        yield from c.values()
        yield in_session
        yield lag
