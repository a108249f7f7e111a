"""The operator's Prometheus metrics: every cluster's quorum state and the reconciles.

Quorum figures are collected at scrape time from the latest view of each cluster (so a
deleted cluster's series disappear with it); reconcile counts and durations are ordinary
counters and histograms. Labels: ``cluster`` is ``<namespace>/<name>``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .health import ReconcileProgress
from .observe import ClusterView


@dataclass
class ClusterFigures:
    view: ClusterView | None = None
    zookeeper_reachable: bool = False
    storage_ready: int = 0
    storage_desired: int = 0
    server_ready: int = 0
    server_desired: int = 0


class _QuorumCollector(Collector):
    def __init__(self, clusters: dict[str, ClusterFigures]) -> None:
        self._clusters = clusters

    def collect(self) -> Iterator[Metric]:
        def gauge(name: str, doc: str, *labels: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(f"waltz_operator_{name}", doc, labels=["cluster", *labels])

        zk = gauge("zookeeper_reachable", "1 when the cluster's ZooKeeper answers")
        pods = {
            (tier, what): gauge(f"{tier}_pods_{what}", f"{tier.capitalize()} pods {what}")
            for tier in ("storage", "server")
            for what in ("ready", "desired")
        }
        assigned = gauge("partition_replicas_assigned", "Replicas assigned", "partition")
        live = gauge(
            "partition_replicas_live", "Assigned replicas in the store session", "partition"
        )
        quorum = gauge(
            "partition_quorum", "1 while the store session holds a majority", "partition"
        )
        hwm = gauge("partition_high_water_mark", "Highest committed transaction ID", "partition")
        generation = gauge("partition_generation", "The owner's generation", "partition")
        session = gauge(
            "partition_store_session_id", "Running store session (-1: none)", "partition"
        )
        owner = gauge("partition_owner_info", "The partition's owning server", "partition", "owner")
        lag = gauge(
            "replica_lag_transactions",
            "Committed transactions a replica does not hold yet",
            "partition",
            "replica",
        )
        node_up = gauge("storage_node_up", "1 when the storage node answers /readyz", "node")
        for cluster, figures in sorted(self._clusters.items()):
            zk.add_metric([cluster], 1 if figures.zookeeper_reachable else 0)
            for (tier, what), family in pods.items():
                family.add_metric([cluster], getattr(figures, f"{tier}_{what}"))
            view = figures.view
            if view is None:
                continue
            for p in view.partitions:
                label = [cluster, str(p.partition)]
                assigned.add_metric(label, len(p.assigned))
                live.add_metric(label, len(p.live & set(p.assigned)))
                quorum.add_metric(label, 1 if p.quorum else 0)
                hwm.add_metric(label, p.high_water_mark)
                generation.add_metric(label, p.generation)
                session.add_metric(label, p.reported.session_id if p.reported else -1)
                owner.add_metric([*label, p.owner or ""], 1)
                if p.reported is not None:
                    for replica, behind in sorted(p.reported.lag.items()):
                        lag.add_metric([*label, replica], behind)
            for node, up in sorted(view.storage_up.items()):
                node_up.add_metric([cluster, node], 1 if up else 0)
        yield zk
        yield from pods.values()
        yield from (assigned, live, quorum, hwm, generation, session, owner, lag, node_up)


# A cluster none of whose reconciles finished for this long makes /healthz fail.
STALL_AFTER = 300.0


class OperatorMetrics:
    def __init__(self, stall_after: float = STALL_AFTER) -> None:
        self.registry = CollectorRegistry()
        self.clusters: dict[str, ClusterFigures] = {}
        self.progress = ReconcileProgress(stall_after)
        self.registry.register(_QuorumCollector(self.clusters))
        self.reconciles = Counter(
            "waltz_operator_reconciles",
            "Reconciles of a WaltzCluster",
            ["cluster"],
            registry=self.registry,
        )
        self.reconcile_errors = Counter(
            "waltz_operator_reconcile_errors",
            "Reconciles that failed (retried)",
            ["cluster"],
            registry=self.registry,
        )
        self.reconcile_seconds = Histogram(
            "waltz_operator_reconcile_duration_seconds",
            "Time one reconcile took",
            ["cluster"],
            registry=self.registry,
        )
        self.leader = Gauge(
            "waltz_operator_leader",
            "1 while this replica leads (holds the Lease, or runs without election)",
            registry=self.registry,
        )
        self.refusals = Counter(
            "waltz_operator_refusals",
            "Changes the operator refused to make (a scale-down, a foreign cluster...)",
            ["cluster"],
            registry=self.registry,
        )

    def figures(self, cluster: str) -> ClusterFigures:
        return self.clusters.setdefault(cluster, ClusterFigures())

    def forget(self, cluster: str) -> None:
        self.clusters.pop(cluster, None)
        for metric in (
            self.reconciles,
            self.reconcile_errors,
            self.reconcile_seconds,
            self.refusals,
        ):
            with contextlib.suppress(KeyError):
                metric.remove(cluster)

    def app(self) -> web.Application:
        from prometheus_client import generate_latest

        async def metrics(_: web.Request) -> web.Response:
            body = generate_latest(self.registry)
            return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

        async def healthz(_: web.Request) -> web.Response:
            alive, body = self.progress.report()
            body["clusters"] = sorted(self.clusters)
            return web.json_response(body, status=200 if alive else 503)

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/healthz", healthz)
        return app
