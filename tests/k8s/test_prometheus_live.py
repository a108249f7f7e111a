"""The chart's alerts and dashboard against a real Prometheus scraping a real local
cluster (ZooKeeper, three storage nodes, a server) and the operator's /metrics.

- The operator's half that feeds its /metrics runs in this process as the operator runs
  it (waltz_operator.metrics.OperatorMetrics served over HTTP, a ClusterMonitor
  following the cluster wired as cluster_connections.py does, the leader gauge set as
  main.py does without election); what a reconcile records (reconcile.py) is recorded by
  a loop here, as there is no Kubernetes API to reconcile against.
- prometheus.yml has a static target per daemon and one for the operator, labelled with
  what Kubernetes service discovery gives a pod (``__meta_kubernetes_*``), and the
  chart's own PodMonitor relabelings (and the operator PodMonitor's metric relabelings)
  turned into relabel_configs: the series get ``waltz_cluster``, ``waltz_namespace``,
  ``waltz_component`` and ``pod`` from Prometheus itself. Scrapes and rule evaluations
  every second.
- The rules are the chart's, with each ``for:`` cut to a few seconds (for this test
  only).

Healthy, no alert fires; every dashboard query (and template variable) returns series;
with two of the three storage nodes killed every partition loses its quorum and
Prometheus fires WaltzPartitionQuorumLost for each (checked on its /api/v1/alerts);
with them started again it clears.

Needs the prometheus binary (``make prometheus-deps``) and ZooKeeper; skips without.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import pathlib
import re
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from aiohttp import web
from test_alert_rules import (
    DASHBOARD,
    chart_rule_groups,
    pod_monitors,
    require_prometheus_binary,
)

from waltz_client import (
    SubmitStatus,
    TransactionBuilder,
    TransactionContext,
    WaltzClient,
    WaltzClientConfig,
)
from waltz_operator.metrics import OperatorMetrics
from waltz_operator.monitor import ClusterMonitor, MonitorSettings
from waltz_operator.observe import ClusterView

pytestmark = pytest.mark.timeout(900)

NAMESPACE, NAME = "shop", "orders"  # the WaltzCluster the local cluster plays
KEY = f"{NAMESPACE}/{NAME}"  # the operator's cluster label
OPERATOR_POD = "rel-waltz-operator-5d8f7-q4x2m"
SHORT_FOR = "3s"  # every alert's for: in this test (the chart's are minutes)
PARTITIONS = 2
TIMEOUT = 240.0  # generous: a busy two-core machine


# --- the operator's /metrics, in this process ---------------------------------------------


class OperatorHalf:
    """OperatorMetrics on an HTTP port, fed by a ClusterMonitor of the cluster and a
    reconcile loop, on an event loop of its own thread."""

    def __init__(self, zookeeper: str, root: str, ready_urls: dict[str, str]) -> None:
        self.zookeeper, self.root, self.ready_urls = zookeeper, root, ready_urls
        self.metrics = OperatorMetrics()
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="operator-metrics", daemon=True)

    def start(self) -> None:
        self._thread.start()
        if not self._started.wait(60):
            raise AssertionError("the operator's metrics did not start")
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._main())
        except BaseException as e:  # reported by start()
            self._error = e
            self._started.set()
        finally:
            self._loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        metrics = self.metrics
        figures = metrics.figures(KEY)
        monitor: ClusterMonitor

        def on_view(view: ClusterView | None) -> None:  # as cluster_connections.py
            figures.view = view
            figures.zookeeper_reachable = monitor.zookeeper_error is None

        monitor = ClusterMonitor(
            self.zookeeper,
            self.root,
            self.ready_urls.get,
            MonitorSettings(scrape_interval=0.5, scrape_timeout=3.0),
            on_view,
        )
        metrics.leader.set(1)  # main.py, running without leader election
        # A reconcile that failed before the scrapes began (an operator that has run a
        # while has had some): the errors series exists, at a rate of 0.
        metrics.reconcile_errors.labels(KEY).inc()
        runner = web.AppRunner(metrics.app())
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = runner.addresses[0][1]
        self._started.set()
        try:
            while not self._stop.is_set():
                # What a reconcile records (reconcile.py: Reconciler.reconcile, _reported).
                metrics.reconciles.labels(KEY).inc()
                with metrics.reconcile_seconds.labels(KEY).time():
                    view = figures.view
                    up = sum(view.storage_up.values()) if view is not None else 0
                    figures.storage_ready, figures.storage_desired = up, len(self.ready_urls)
                    figures.server_ready = figures.server_desired = 1
                    metrics.refusals.labels(KEY).inc(0)
                    await asyncio.sleep(0.01)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), 2.0)
        finally:
            await monitor.close()
            await runner.cleanup()


# --- Prometheus ---------------------------------------------------------------------------


def relabel_configs(relabelings: list[dict]) -> list[dict]:
    """A PodMonitor's relabelings as Prometheus' relabel_configs."""
    names = {
        "sourceLabels": "source_labels",
        "targetLabel": "target_label",
        "regex": "regex",
        "replacement": "replacement",
        "separator": "separator",
    }
    out = []
    for r in relabelings:
        unknown = set(r) - set(names) - {"action"}
        assert not unknown, f"relabeling fields this test does not translate: {unknown}"
        out.append(
            {"action": r.get("action", "replace").lower()}
            | {names[k]: v for k, v in r.items() if k in names}
        )
    return out


def pod_meta(namespace: str, name: str, labels: dict[str, str]) -> dict[str, str]:
    """What Kubernetes service discovery gives a pod's target (a plain-text cluster's
    pods have no waltz.io/metrics-scheme annotation: scraped over HTTP)."""
    return {
        "__meta_kubernetes_namespace": namespace,
        "__meta_kubernetes_pod_name": name,
        **{
            "__meta_kubernetes_pod_label_" + re.sub("[^a-zA-Z0-9_]", "_", k): v
            for k, v in labels.items()
        },
    }


def prometheus_config(cluster: Any, operator_port: int) -> dict:
    """Scrape configs as the Prometheus Operator makes of the chart's PodMonitors (its
    jobs are named <namespace>/<PodMonitor>), the targets given as static ones."""
    monitors = pod_monitors()
    (clusters,) = [m for n, m in monitors.items() if n.endswith("-clusters")]
    (operator,) = [m for n, m in monitors.items() if n.endswith("-operator")]
    (daemons,) = clusters["spec"]["podMetricsEndpoints"]
    (operator_endpoint,) = operator["spec"]["podMetricsEndpoints"]

    def daemon(pod: str, tier: str, port: int) -> dict:
        labels = {
            "app.kubernetes.io/name": "waltz",
            "app.kubernetes.io/managed-by": "waltz-operator",
            "app.kubernetes.io/instance": NAME,
            "app.kubernetes.io/component": tier,
        }
        return {"targets": [f"127.0.0.1:{port}"], "labels": pod_meta(NAMESPACE, pod, labels)}

    # Pod names: a server's ID is its pod's name (the local servers' IDs are server-<i>).
    targets = [
        daemon(f"storage-{i}", "storage", s.ready["http_port"])
        for i, s in enumerate(cluster.storages)
    ] + [
        daemon(f"server-{i}", "server", s.ready["http_port"]) for i, s in enumerate(cluster.servers)
    ]
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": f"{clusters['metadata']['namespace']}/{clusters['metadata']['name']}",
                "metrics_path": daemons["path"],
                "static_configs": targets,
                "relabel_configs": relabel_configs(daemons["relabelings"]),
            },
            {
                "job_name": f"{operator['metadata']['namespace']}/{operator['metadata']['name']}",
                "metrics_path": operator_endpoint["path"],
                "static_configs": [
                    {
                        "targets": [f"127.0.0.1:{operator_port}"],
                        # The operator runs in the release's namespace.
                        "labels": pod_meta(
                            operator["metadata"]["namespace"],
                            OPERATOR_POD,
                            {"app.kubernetes.io/name": "waltz"},
                        ),
                    }
                ],
                "relabel_configs": relabel_configs(operator_endpoint["relabelings"]),
                "metric_relabel_configs": relabel_configs(operator_endpoint["metricRelabelings"]),
            },
        ],
    }


def short_rules() -> list[dict]:
    """The chart's rules with every for: cut to SHORT_FOR, for this test only: the
    chart's minutes would make it wait minutes for each alert."""
    groups = chart_rule_groups()
    for group in groups:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = SHORT_FOR
    return groups


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Prometheus:
    def __init__(self, binary: str, config: dict, rules: list[dict], where: pathlib.Path):
        where.mkdir(parents=True, exist_ok=True)
        (where / "rules.yaml").write_text(yaml.safe_dump({"groups": rules}, sort_keys=False))
        config["rule_files"] = [str(where / "rules.yaml")]
        (where / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = where / "prometheus.log"
        self.command = [
            binary,
            f"--config.file={where / 'prometheus.yml'}",
            f"--storage.tsdb.path={where / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        eventually("Prometheus ready", self.ready, timeout=120)

    def ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited ({self.proc.returncode}):\n{self.log()}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=5) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def log(self) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-30:])

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=30) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", data
        return data["result"]

    def alerts(self, state: str | None = None) -> list[dict]:
        """Active alerts (pending and firing), or only those in ``state``."""
        alerts = self.api("alerts")["alerts"]
        return [a for a in alerts if state is None or a["state"] == state]


def eventually(
    what: str,
    predicate: Callable[[], Any],
    timeout: float = TIMEOUT,
    state: Callable[[], Any] | None = None,
) -> Any:
    """``predicate()``'s result once true; on a timeout the error says ``state()``."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            now = f": {state()}" if state is not None else ""
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{now}")
        time.sleep(0.5)


def summary(alerts: list[dict]) -> list[str]:
    def one(alert: dict) -> str:
        labels = alert["labels"]
        rest = ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "alertname")
        return f"{labels['alertname']}{{{rest}}} {alert['state']}"

    return sorted(one(a) for a in alerts)


# --- the dashboard --------------------------------------------------------------------------

# Grafana's interval variables as it would send them for a recent range over series
# scraped every 15 s (the data source's default): $__rate_interval = 4 scrapes.
INTERVALS = {"__rate_interval": "1m", "__interval": "15s", "__range": "5m"}


def dashboard_queries() -> tuple[list[tuple[str, str]], list[tuple[str, str, str]]]:
    """(panel title, query) of every target with the template variables substituted (the
    namespace and cluster variables as this cluster's), and (variable, metric selector,
    label) of the variables' label_values queries."""
    dashboard = json.loads(DASHBOARD.read_text())
    values = dict(INTERVALS)
    label_queries = []
    for variable in dashboard["templating"]["list"]:
        name = variable["name"]
        if variable["type"] == "datasource":
            continue
        query = variable["query"]
        query = query["query"] if isinstance(query, dict) else query
        m = re.fullmatch(r"label_values\((.*), *(\w+)\)", query)
        assert m, f"variable ${name}: a query this test does not know: {query}"
        label_queries.append((name, m.group(1), m.group(2)))
        values[name] = {"waltz_namespace": NAMESPACE, "waltz_cluster": NAME}[m.group(2)]

    def substitute(expr: str) -> str:
        for name in sorted(values, key=len, reverse=True):
            expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
        assert "$" not in expr, f"a variable the dashboard does not define: {expr}"
        return expr

    targets = []
    for panel in dashboard["panels"]:
        for sub in [panel, *panel.get("panels", [])]:
            for target in sub.get("targets", []):
                targets.append((sub["title"], substitute(target["expr"])))
    return targets, [(n, substitute(s), label) for n, s, label in label_queries]


# --- the test -------------------------------------------------------------------------------


class Put(TransactionContext):
    def __init__(self, partition: int) -> None:
        self.partition = partition

    def partition_id(self, num_partitions: int) -> int:
        return self.partition

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_data(b"scraped")
        return True


def write_transactions(cluster: Any, count: int) -> None:
    """``count`` transactions to each partition, one partition after the other, then
    ``count`` to every partition at once. In the first, a storage node's write group
    holds one partition's appends, which get the partition's own fsync (timed by
    waltz_storage_fsync_seconds); in the second, appends of several partitions share a
    group sync (timed by waltz_storage_group_sync_seconds). The dashboard's fsync panel
    shows both."""

    async def write() -> None:
        config = WaltzClientConfig(
            cluster.zookeeper_connect, zk_root=cluster.layout.root, feed=False, request_timeout=10.0
        )
        async with WaltzClient(config) as client:
            for partition in range(PARTITIONS):
                results = await asyncio.gather(
                    *(client.submit(Put(partition)) for _ in range(count))
                )
                assert {r.status for r in results} == {SubmitStatus.COMMITTED}, results
            together = await asyncio.gather(
                *(client.submit(Put(p)) for p in range(PARTITIONS) for _ in range(count))
            )
            assert {r.status for r in together} == {SubmitStatus.COMMITTED}, together

    asyncio.run(write())


def quorum_alerts(prometheus: Prometheus, state: str) -> list[dict]:
    return [
        a
        for a in prometheus.alerts(state)
        if a["labels"]["alertname"] == "WaltzPartitionQuorumLost"
    ]


def test_alerts_and_dashboard_on_a_real_prometheus(make_cluster, tmp_path):
    binary = require_prometheus_binary("prometheus")
    cluster = make_cluster(partitions=PARTITIONS, servers=1)
    assert cluster.layout.replicas == 3 and len(cluster.storages) == 3
    ready_urls = {
        address: f"http://127.0.0.1:{storage.ready['http_port']}/readyz"
        for address, storage in zip(cluster.layout.storage_addresses, cluster.storages, strict=True)
    }
    operator = OperatorHalf(cluster.zookeeper_connect, cluster.layout.root, ready_urls)
    operator.start()
    prometheus: Prometheus | None = None
    try:
        config = prometheus_config(cluster, operator.port)
        prometheus = Prometheus(binary, config, short_rules(), tmp_path / "prometheus")
        prometheus.start()
        p = prometheus
        targets = len(cluster.storages) + len(cluster.servers) + 1

        def active() -> list[str]:
            return summary(p.alerts())

        # Every target scraped, with the labels the PodMonitors give; the cluster healthy.
        def all_up() -> bool:
            up = p.query("up")
            return len(up) == targets and all(s["value"][1] == "1" for s in up)

        eventually("every target up", all_up)
        pods = {
            s["metric"]["pod"]: s["metric"]
            for s in p.query(f'process_open_fds{{waltz_namespace="{NAMESPACE}"}}')
        }
        assert sorted(pods) == ["server-0", "storage-0", "storage-1", "storage-2"], pods
        for pod, labels in pods.items():
            assert labels["waltz_cluster"] == NAME, labels
            assert labels["waltz_component"] == pod.split("-")[0], labels
        quorum = 'waltz_operator_partition_quorum{waltz_namespace="shop", waltz_cluster="orders"}'
        eventually(
            "every partition with a quorum (the operator's view, scraped)",
            lambda: (
                len(r := p.query(quorum)) == PARTITIONS and all(s["value"][1] == "1" for s in r)
            ),
        )
        for series in p.query(quorum):
            assert series["metric"]["pod"] == OPERATOR_POD, series

        write_transactions(cluster, 10)

        # Healthy: nothing fires (once start-up is over), and stays so.
        eventually(
            "no alert firing on the healthy cluster", lambda: not p.alerts("firing"), state=active
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            assert not p.alerts("firing"), summary(p.alerts())
            time.sleep(1)

        # Every dashboard query returns series with a value. Transactions are written
        # before each round: the rates and latencies need increases inside their window
        # (a labelled histogram's series appear at its first observation, so the first
        # writes only create them).
        queries, label_queries = dashboard_queries()
        assert queries

        def answered() -> list[str]:
            write_transactions(cluster, 5)
            time.sleep(2)  # two scrapes
            missing = []
            for title, expr in queries:
                result = p.query(expr)
                values = [float(s["value"][1]) for s in result]
                if not any(math.isfinite(v) for v in values):
                    missing.append(f"panel {title!r}: {expr} -> {result}")
            return missing

        try:
            eventually("every dashboard query answered", lambda: not answered(), timeout=120)
        except AssertionError:
            raise AssertionError("\n".join(answered())) from None
        for name, selector, label in label_queries:
            found = p.api(f"label/{label}/values", **{"match[]": selector})
            wanted = {"waltz_namespace": NAMESPACE, "waltz_cluster": NAME}[label]
            assert wanted in found, (name, selector, found)

        # Two of the three storage nodes die: no partition has a majority of its replicas.
        for storage in cluster.storages[1:]:
            storage.kill()
        firing = eventually(
            "WaltzPartitionQuorumLost firing for every partition",
            lambda: len(a := quorum_alerts(p, "firing")) == PARTITIONS and a,
            state=active,
        )
        assert sorted(a["labels"]["partition"] for a in firing) == ["0", "1"], firing
        for alert in firing:
            labels, part = alert["labels"], alert["labels"]["partition"]
            assert labels["severity"] == "critical", labels
            assert (labels["waltz_namespace"], labels["waltz_cluster"]) == (NAMESPACE, NAME)
            annotations = alert["annotations"]
            assert annotations["summary"] == f"Partition {part} of shop/orders has no quorum"
            assert f"partition {part} of WaltzCluster shop/orders" in annotations["description"]
            assert annotations["runbook_url"].endswith("operations.md#waltzpartitionquorumlost")
        # ... and the operator's probe of the two nodes fails: WaltzStorageNodeNotReady.
        killed = sorted(cluster.layout.storage_addresses[1:])

        def not_ready() -> list[str]:
            alerts = p.alerts("firing")
            return sorted(
                a["labels"]["node"]
                for a in alerts
                if a["labels"]["alertname"] == "WaltzStorageNodeNotReady"
            )

        eventually(
            "WaltzStorageNodeNotReady firing for the two nodes",
            lambda: not_ready() == killed,
            state=active,
        )
        print("alerts with two storage nodes down:", *summary(p.alerts()), sep="\n  ")

        # They come back: the quorum alert clears, and then every other one.
        for storage in cluster.storages[1:]:
            storage.start()
        eventually(
            "WaltzPartitionQuorumLost cleared", lambda: not quorum_alerts(p, None), state=active
        )
        eventually("every alert cleared", lambda: not p.alerts(), state=active)
    finally:
        if prometheus is not None:
            prometheus.kill()
        operator.stop()
