"""The chart's monitoring (charts/waltz/templates/monitoring-*.yaml and
charts/waltz/dashboards/waltz.json), rendered by a real helm:

- the PodMonitors select the pods the operator makes (desired.py) and the chart's
  operator pod, in the watched namespaces, on ports those pods have, and their
  relabelings give every series ``waltz_cluster``, ``waltz_namespace`` and ``pod``;
- the PrometheusRule's alerts have a severity, a summary, a description and a runbook
  that exists in docs/operations.md#alerts;
- the dashboard ConfigMap carries charts/waltz/dashboards/waltz.json, whose panels all
  have a data source and queries;
- every PromQL expression (alerts and dashboard) parses (a small PromQL parser below:
  brackets, functions and aggregations, argument types, durations, matchers; Prometheus'
  own promtool checks them too, in test_alert_rules.py);
- every metric they use is exposed by the real daemons of a local cluster and by the
  operator's own /metrics (its monitor following that cluster), with the labels the
  expressions, legends and annotations name.
"""

from __future__ import annotations

import asyncio
import copy
import json
import pathlib
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import aiohttp
import jsonschema
import pytest
from aiohttp.test_utils import TestClient, TestServer
from helm_binary import helm_template as chart_documents
from prometheus_client.parser import text_string_to_metric_families

from waltz_client import (
    SubmitStatus,
    TransactionBuilder,
    TransactionContext,
    WaltzClient,
    WaltzClientConfig,
)
from waltz_operator.desired import desired_objects
from waltz_operator.metrics import OperatorMetrics
from waltz_operator.monitor import ClusterMonitor, MonitorSettings
from waltz_operator.observe import ClusterView
from waltz_operator.spec import parse

pytestmark = pytest.mark.timeout(120)

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "waltz"
DASHBOARD = CHART / "dashboards" / "waltz.json"
OPERATIONS = ROOT / "docs" / "operations.md"
RUNBOOKS = "https://github.com/waltz-io/waltz/blob/main/docs/operations.md#"
NAMESPACE = "waltz"
WATCHED = ["team-a", "team-b", NAMESPACE]  # the release's own namespace listed again

MONITORING_ON = [
    "--set",
    "cluster.enabled=true",
    "--set",
    "monitoring.podMonitor.enabled=true,monitoring.prometheusRule.enabled=true,"
    "monitoring.dashboard.enabled=true",
]
NAMESPACED = [
    *MONITORING_ON,
    "--set-json",
    f"operator.watch.namespaces={json.dumps(WATCHED)}",
    "--set",
    "monitoring.podMonitor.interval=15s,monitoring.podMonitor.labels.release=prom,"
    "monitoring.prometheusRule.labels.release=prom,"
    "monitoring.prometheusRule.replicaOutOfSessionFor=7m,monitoring.dashboard.folder=Storage",
    "--set-json",
    "monitoring.prometheusRule.diskFullFraction=0.9",
]
CLUSTER_WIDE = [*MONITORING_ON, "--set", "operator.watch.clusterWide=true"]
MONITORING_KINDS = {"PodMonitor", "PrometheusRule"}


def helm_template(*args: str) -> list[dict]:
    return chart_documents(str(CHART), NAMESPACE, *args)


@dataclass
class Rendered:
    objects: list[dict]

    def kind(self, kind: str) -> list[dict]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str, name: str) -> dict:
        (obj,) = [o for o in self.kind(kind) if o["metadata"]["name"] == name]
        return obj

    @property
    def cluster_monitor(self) -> dict:
        return self.one("PodMonitor", "rel-waltz-clusters")

    @property
    def operator_monitor(self) -> dict:
        return self.one("PodMonitor", "rel-waltz-operator")

    @property
    def rule(self) -> dict:
        (rule,) = self.kind("PrometheusRule")
        return rule

    @property
    def dashboard_map(self) -> dict:
        return self.one("ConfigMap", "rel-waltz-dashboard")

    @property
    def operator_pod(self) -> dict:
        return self.one("Deployment", "rel-waltz-operator")["spec"]["template"]

    def waltz_pods(self) -> dict[str, dict]:
        """The pod templates the operator makes of the chart's WaltzCluster, by tier."""
        (resource,) = self.kind("WaltzCluster")
        resource = {**resource, "metadata": {**resource["metadata"], "uid": "u-1"}}
        pods = {}
        for made in desired_objects(parse(resource)):
            if made["kind"] in ("StatefulSet", "Deployment"):
                template = made["spec"]["template"]
                pods[template["metadata"]["labels"]["app.kubernetes.io/component"]] = {
                    **template,
                    "metadata": {
                        **template["metadata"],
                        "namespace": made["metadata"]["namespace"],
                    },
                }
        return pods


@pytest.fixture(scope="module")
def namespaced() -> Rendered:
    return Rendered(helm_template(*NAMESPACED))


@pytest.fixture(scope="module")
def cluster_wide() -> Rendered:
    return Rendered(helm_template(*CLUSTER_WIDE))


# --- the Prometheus Operator's objects: the fields the chart uses -----------------------

DURATION_PATTERN = "^([0-9]+(ms|s|m|h|d|w|y))+$"
LABEL_NAME = "^[a-zA-Z_][a-zA-Z0-9_]*$"
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
METADATA = {
    "type": "object",
    "required": ["name", "namespace", "labels"],
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
        "namespace": {"type": "string"},
        "labels": STRING_MAP,
        "annotations": STRING_MAP,
    },
}
RELABEL = {
    "type": "object",
    "additionalProperties": False,
    "required": ["targetLabel"],
    "properties": {
        "action": {"enum": ["replace", "Replace"]},
        "sourceLabels": {
            "type": "array",
            "minItems": 1,
            "items": {"type": "string", "pattern": LABEL_NAME},
        },
        "separator": {"type": "string"},
        "targetLabel": {"type": "string", "pattern": LABEL_NAME},
        "regex": {"type": "string"},
        "replacement": {"type": "string"},
    },
}
SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "matchLabels": STRING_MAP,
        "matchExpressions": {
            "type": "array",
            "items": {
                "type": "object",
                "additionalProperties": False,
                "required": ["key", "operator"],
                "properties": {
                    "key": {"type": "string"},
                    "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                    "values": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    },
}
POD_MONITOR_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PodMonitor"},
        "metadata": METADATA,
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "namespaceSelector", "podMetricsEndpoints"],
            "properties": {
                "selector": SELECTOR,
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "minProperties": 1,
                    "maxProperties": 1,
                    "properties": {
                        "any": {"const": True},
                        "matchNames": {
                            "type": "array",
                            "minItems": 1,
                            "uniqueItems": True,
                            "items": {"type": "string", "minLength": 1},
                        },
                    },
                },
                "podMetricsEndpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["port", "path"],
                        "properties": {
                            "port": {"type": "string", "minLength": 1},
                            "path": {"type": "string", "pattern": "^/"},
                            "interval": {"type": "string", "pattern": DURATION_PATTERN},
                            "relabelings": {"type": "array", "items": RELABEL},
                            "metricRelabelings": {"type": "array", "items": RELABEL},
                            "scheme": {"enum": ["http", "https"]},
                            "tlsConfig": {
                                "type": "object",
                                "additionalProperties": False,
                                "properties": {
                                    "insecureSkipVerify": {"type": "boolean"},
                                    "serverName": {"type": "string", "minLength": 1},
                                    "ca": {
                                        "type": "object",
                                        "additionalProperties": False,
                                        "properties": {
                                            "secret": {
                                                "type": "object",
                                                "additionalProperties": False,
                                                "required": ["name", "key"],
                                                "properties": {
                                                    "name": {"type": "string", "minLength": 1},
                                                    "key": {"type": "string", "minLength": 1},
                                                },
                                            }
                                        },
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}
PROMETHEUS_RULE_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": METADATA,
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["groups"],
            "properties": {
                "groups": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["name", "rules"],
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "rules": {
                                "type": "array",
                                "minItems": 1,
                                "items": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "required": ["alert", "expr", "for", "labels", "annotations"],
                                    "properties": {
                                        "alert": {"type": "string", "pattern": "^Waltz[A-Za-z]+$"},
                                        "expr": {"type": "string", "minLength": 1},
                                        "for": {"type": "string", "pattern": DURATION_PATTERN},
                                        "labels": {
                                            "type": "object",
                                            "additionalProperties": False,
                                            "required": ["severity"],
                                            "properties": {
                                                "severity": {"enum": ["critical", "warning"]}
                                            },
                                        },
                                        "annotations": {
                                            "type": "object",
                                            "additionalProperties": False,
                                            "required": ["summary", "description", "runbook_url"],
                                            "properties": {
                                                "summary": {"type": "string", "minLength": 10},
                                                "description": {"type": "string", "minLength": 20},
                                                "runbook_url": {
                                                    "type": "string",
                                                    "pattern": "^" + re.escape(RUNBOOKS),
                                                },
                                            },
                                        },
                                    },
                                },
                            },
                        },
                    },
                }
            },
        },
    },
}


def matches(selector: dict, labels: dict[str, str]) -> bool:
    """A Kubernetes label selector against a pod's labels."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        present, value = e["key"] in labels, labels.get(e["key"])
        ok = {
            "In": present and value in e.get("values", []),
            "NotIn": not present or value not in e.get("values", []),
            "Exists": present,
            "DoesNotExist": not present,
        }[e["operator"]]
        if not ok:
            return False
    return True


def relabel(labels: dict[str, str], configs: list[dict]) -> dict[str, str]:
    """Prometheus' relabelling (action replace, the only one the chart uses): the regex
    is anchored, $N expands its groups, an empty result deletes the target label."""
    out = dict(labels)
    for c in configs:
        assert c.get("action", "replace").lower() == "replace", c
        value = c.get("separator", ";").join(out.get(s, "") for s in c.get("sourceLabels", []))
        m = re.fullmatch(c.get("regex", "(.*)"), value)
        if m is None:
            continue
        result = m.expand(re.sub(r"\$\{?(\d+)\}?", r"\\g<\1>", c.get("replacement", "$1")))
        if result:
            out[c["targetLabel"]] = result
        else:
            out.pop(c["targetLabel"], None)
    return out


# Labels the Prometheus Operator gives every target of a PodMonitor (before the
# PodMonitor's own relabelings).
OPERATOR_TARGET_LABELS = ("namespace", "pod", "container", "endpoint", "job", "instance")


def _relabelled(monitor: dict, pod: dict, port: str) -> dict[str, str]:
    """A scraped pod's target labels after ``monitor``'s relabelings, ``__`` ones too
    (``__scheme__`` starts as the endpoint's scheme, http unless it says otherwise)."""

    def name(key: str) -> str:
        return re.sub("[^a-zA-Z0-9_]", "_", key)

    (endpoint,) = [e for e in monitor["spec"]["podMetricsEndpoints"] if e["port"] == port]
    meta = {
        "__scheme__": endpoint.get("scheme", "http"),
        "__meta_kubernetes_namespace": pod["metadata"]["namespace"],
        "__meta_kubernetes_pod_name": pod["metadata"].get("name", "a-pod-0"),
        **{
            "__meta_kubernetes_pod_label_" + name(k): v
            for k, v in pod["metadata"]["labels"].items()
        },
        **{
            "__meta_kubernetes_pod_annotation_" + name(k): v
            for k, v in (pod["metadata"].get("annotations") or {}).items()
        },
        **dict.fromkeys(OPERATOR_TARGET_LABELS, "set-by-the-prometheus-operator"),
    }
    return relabel(meta, endpoint.get("relabelings", []))


def target_labels(monitor: dict, pod: dict, port: str) -> dict[str, str]:
    """The labels a scraped pod's series get through ``monitor``'s relabelings."""
    return {k: v for k, v in _relabelled(monitor, pod, port).items() if not k.startswith("__")}


def scrape_scheme(monitor: dict, pod: dict, port: str) -> str:
    return _relabelled(monitor, pod, port)["__scheme__"]


def metric_relabelings(monitor: dict) -> list[dict]:
    return [
        r for e in monitor["spec"]["podMetricsEndpoints"] for r in e.get("metricRelabelings", [])
    ]


def container_ports(pod: dict) -> set[str]:
    return {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}


def check_pod_monitors(rendered: Rendered, namespaces: list[str] | None) -> None:
    """The PodMonitors against the pods they must scrape (``namespaces`` None: any)."""
    pods = rendered.waltz_pods()
    assert set(pods) == {"storage", "server"}
    clusters, operator = rendered.cluster_monitor, rendered.operator_monitor
    for monitor in (clusters, operator):
        jsonschema.validate(monitor, POD_MONITOR_SCHEMA)
        assert monitor["metadata"]["namespace"] == NAMESPACE
    selector = clusters["spec"]["namespaceSelector"]
    if namespaces is None:
        assert selector == {"any": True}
    else:
        assert selector == {"matchNames": namespaces}
    for tier, pod in pods.items():
        assert matches(clusters["spec"]["selector"], pod["metadata"]["labels"]), tier
        assert not matches(operator["spec"]["selector"], pod["metadata"]["labels"]), tier
        assert namespaces is None or pod["metadata"]["namespace"] in namespaces
        (endpoint,) = clusters["spec"]["podMetricsEndpoints"]
        assert endpoint["port"] in container_ports(pod), (tier, container_ports(pod))
        assert endpoint["path"] == "/metrics"
        pod = copy.deepcopy(pod)
        pod["metadata"]["name"] = f"{tier}-pod-0"
        labels = target_labels(clusters, pod, "http")
        assert labels["waltz_cluster"] == pod["metadata"]["labels"]["app.kubernetes.io/instance"]
        assert labels["waltz_cluster"] == rendered.kind("WaltzCluster")[0]["metadata"]["name"]
        assert labels["waltz_namespace"] == pod["metadata"]["namespace"]
        assert labels["pod"] == f"{tier}-pod-0"
        # The chart's cluster is on the operator's CA: its metrics ports serve HTTPS. A
        # cluster in plain text (no annotation) is scraped over HTTP.
        assert scrape_scheme(clusters, pod, "http") == "https"
        assert endpoint["tlsConfig"] == {"insecureSkipVerify": True}
        pod["metadata"]["annotations"] = {}
        assert scrape_scheme(clusters, pod, "http") == "http"
    operator_pod = {**rendered.operator_pod, "metadata": {**rendered.operator_pod["metadata"]}}
    operator_pod["metadata"]["namespace"] = NAMESPACE
    assert matches(operator["spec"]["selector"], operator_pod["metadata"]["labels"])
    assert not matches(clusters["spec"]["selector"], operator_pod["metadata"]["labels"])
    assert operator["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = operator["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics" and endpoint["port"] in container_ports(operator_pod)
    assert endpoint["path"] == "/metrics"
    assert target_labels(operator, operator_pod, "metrics")["pod"] == "a-pod-0"
    # The operator's series name their cluster "<namespace>/<name>".
    series = relabel({"cluster": "team-a/orders", "partition": "3"}, metric_relabelings(operator))
    assert series["waltz_namespace"] == "team-a" and series["waltz_cluster"] == "orders"
    assert series["partition"] == "3"


def test_pod_monitors_select_the_cluster_and_operator_pods_in_the_watched_namespaces(
    namespaced, cluster_wide
):
    check_pod_monitors(namespaced, ["waltz", "team-a", "team-b"])
    for monitor in (namespaced.cluster_monitor, namespaced.operator_monitor):
        assert monitor["metadata"]["labels"]["release"] == "prom"
        assert [e["interval"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["15s"]
    check_pod_monitors(cluster_wide, None)
    for monitor in (cluster_wide.cluster_monitor, cluster_wide.operator_monitor):
        assert "release" not in monitor["metadata"]["labels"]
        assert [e["interval"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["30s"]


def test_nothing_of_monitoring_is_rendered_when_off():
    objects = helm_template("--set", "cluster.enabled=true")
    assert not [o for o in objects if o["kind"] in MONITORING_KINDS]
    assert not [o for o in objects if o["metadata"]["name"] == "rel-waltz-dashboard"]


# --- the alerts -------------------------------------------------------------------------


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading (before de-duplication)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def doc_sections(text: str) -> dict[str, str]:
    """anchor -> the heading's section text (up to the next heading of any level);
    a repeated heading's anchor gets -1, -2, ... as on GitHub."""
    sections: dict[str, str] = {}
    current = None
    in_code = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        m = None if in_code else re.match(r"^(#{1,6}) (.*)$", line)
        if m:
            anchor = current = github_anchor(m.group(2))
            n = 0
            while current in sections:
                n += 1
                current = f"{anchor}-{n}"
            sections[current] = ""
        elif current is not None:
            sections[current] += line + "\n"
    return sections


def check_runbooks(alerts: list[dict], operations: str) -> None:
    """Every alert has a `### <name>` subsection in `## Alerts`, its runbook_url points
    at it, and the section's own links to docs/operations.md anchors exist."""
    anchors = doc_sections(operations)
    assert "alerts" in anchors, "docs/operations.md has no '## Alerts' section"
    alerts_part = operations[operations.index("\n## Alerts\n") + 1 :]
    alerts_part = alerts_part[: (alerts_part + "\n## ").index("\n## ", 1)]
    subsections = re.findall(r"^### (\S+)\s*$", alerts_part, re.M)
    names = [a["alert"] for a in alerts]
    assert sorted(subsections) == sorted(names), "## Alerts subsections differ from the alerts"
    for alert in alerts:
        url = alert["annotations"]["runbook_url"]
        assert url.startswith(RUNBOOKS), url
        anchor = url[len(RUNBOOKS) :]
        assert anchor == github_anchor(alert["alert"]), url
        assert anchor in anchors, f"{alert['alert']}: no anchor #{anchor} in docs/operations.md"
        assert "**Means.**" in anchors[anchor] and "**Do.**" in anchors[anchor], alert["alert"]
    for link in re.findall(r"\]\(#([^)]+)\)", alerts_part):
        assert link in anchors, f"## Alerts links to #{link}, which docs/operations.md lacks"


def rules(rendered: Rendered) -> list[dict]:
    return [r for g in rendered.rule["spec"]["groups"] for r in g["rules"]]


EXPECTED_ALERTS = {
    "WaltzPartitionQuorumLost": "critical",
    "WaltzReplicaOutOfSession": "warning",
    "WaltzPartitionStuckRecovering": "critical",
    "WaltzPartitionUnowned": "critical",
    "WaltzStoragePartitionUnavailable": "warning",
    "WaltzStorageNodeNotReady": "warning",
    "WaltzStorageDiskFilling": "warning",
    "WaltzOpenFilesNearLimit": "warning",
    "WaltzOperatorReconcileErrors": "warning",
    "WaltzOperatorNoLeader": "warning",
    "WaltzOperatorZooKeeperUnreachable": "critical",
}


def test_the_alerts_have_a_severity_a_summary_a_description_and_a_runbook(namespaced, cluster_wide):
    operations = OPERATIONS.read_text()
    for rendered in (namespaced, cluster_wide):
        jsonschema.validate(rendered.rule, PROMETHEUS_RULE_SCHEMA)
        alerts = rules(rendered)
        assert {a["alert"]: a["labels"]["severity"] for a in alerts} == EXPECTED_ALERTS
        check_runbooks(alerts, operations)
        for alert in alerts:
            for text in alert["annotations"].values():
                check_alert_template(text)
    assert namespaced.rule["metadata"]["labels"]["release"] == "prom"
    assert "release" not in cluster_wide.rule["metadata"]["labels"]
    by_name = {a["alert"]: a for a in rules(namespaced)}
    default = {a["alert"]: a for a in rules(cluster_wide)}
    assert by_name["WaltzReplicaOutOfSession"]["for"] == "7m"
    assert default["WaltzReplicaOutOfSession"]["for"] == "10m"
    # The disk alert fires below 1 - diskFullFraction of free space.
    disk = "waltz_storage_disk_free_bytes / waltz_storage_disk_size_bytes < {}"
    assert " ".join(by_name["WaltzStorageDiskFilling"]["expr"].split()) == disk.format(0.1)
    assert " ".join(default["WaltzStorageDiskFilling"]["expr"].split()) == disk.format(0.15)
    errors = by_name["WaltzOperatorReconcileErrors"]["expr"].replace(" ", "")
    assert errors.startswith("rate(waltz_operator_reconcile_errors_total[")


def check_alert_template(text: str) -> None:
    """Prometheus' alert templates: balanced actions, only $labels.x and $value."""
    assert text.count("{{") == text.count("}}"), text
    for action in re.findall(r"\{\{(.*?)\}\}", text, re.S):
        assert re.fullmatch(
            r"\s*(\$labels\.[a-zA-Z_][a-zA-Z0-9_]*|\$value)(\s*\|\s*[a-zA-Z]+)?\s*", action
        ), f"unexpected template action {{{{{action}}}}} in: {text}"


def test_the_dashboard_config_map_carries_the_dashboard(namespaced, cluster_wide):
    for rendered, folder in ((namespaced, "Storage"), (cluster_wide, None)):
        config_map = rendered.dashboard_map
        assert config_map["metadata"]["namespace"] == NAMESPACE
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert config_map["metadata"].get("annotations", {}).get("grafana_folder") == folder
        assert json.loads(config_map["data"]["waltz.json"]) == json.loads(DASHBOARD.read_text())
    labels = helm_template(
        "--set",
        "monitoring.dashboard.enabled=true",
        "--set-json",
        'monitoring.dashboard.labels={"dashboards": "waltz", "grafana_dashboard": null}',
    )
    (config_map,) = [o for o in labels if o["metadata"]["name"] == "rel-waltz-dashboard"]
    assert config_map["metadata"]["labels"]["dashboards"] == "waltz"
    assert "grafana_dashboard" not in config_map["metadata"]["labels"]


# --- a PromQL parser --------------------------------------------------------------------


class PromQLError(ValueError):
    pass


SCALAR, VECTOR, MATRIX, STRING = "scalar", "instant vector", "range vector", "string"
OPT = "optional"


def words(text: str) -> list[str]:
    return text.split()


# name -> (argument types, return type); a trailing "..." repeats the last type, OPT
# marks where optional arguments begin.
FUNCTIONS: dict[str, tuple[tuple[str, ...], str]] = {
    **dict.fromkeys(
        words(
            """abs ceil exp floor ln log2 log10 sqrt sgn sort sort_desc timestamp absent acos
            acosh asin asinh atan atanh cos cosh sin sinh tan tanh deg rad histogram_avg
            histogram_count histogram_sum histogram_stddev histogram_stdvar"""
        ),
        ((VECTOR,), VECTOR),
    ),
    **dict.fromkeys(
        words(
            """rate irate increase delta idelta deriv changes resets absent_over_time
            avg_over_time min_over_time max_over_time sum_over_time count_over_time
            stddev_over_time stdvar_over_time last_over_time present_over_time mad_over_time"""
        ),
        ((MATRIX,), VECTOR),
    ),
    **dict.fromkeys(
        words("day_of_month day_of_week day_of_year days_in_month hour minute month year"),
        ((OPT, VECTOR), VECTOR),
    ),
    "clamp": ((VECTOR, SCALAR, SCALAR), VECTOR),
    "clamp_max": ((VECTOR, SCALAR), VECTOR),
    "clamp_min": ((VECTOR, SCALAR), VECTOR),
    "round": ((VECTOR, OPT, SCALAR), VECTOR),
    "histogram_quantile": ((SCALAR, VECTOR), VECTOR),
    "histogram_fraction": ((SCALAR, SCALAR, VECTOR), VECTOR),
    "quantile_over_time": ((SCALAR, MATRIX), VECTOR),
    "predict_linear": ((MATRIX, SCALAR), VECTOR),
    "holt_winters": ((MATRIX, SCALAR, SCALAR), VECTOR),
    "double_exponential_smoothing": ((MATRIX, SCALAR, SCALAR), VECTOR),
    "label_replace": ((VECTOR, STRING, STRING, STRING, STRING), VECTOR),
    "label_join": ((VECTOR, STRING, STRING, STRING, "..."), VECTOR),
    "sort_by_label": ((VECTOR, STRING, "..."), VECTOR),
    "sort_by_label_desc": ((VECTOR, STRING, "..."), VECTOR),
    "scalar": ((VECTOR,), SCALAR),
    "vector": ((SCALAR,), VECTOR),
    "time": ((), SCALAR),
    "pi": ((), SCALAR),
}
# aggregation -> the type of its parameter (None: none)
AGGREGATIONS: dict[str, str | None] = {
    **dict.fromkeys(words("sum min max avg group stddev stdvar count")),
    "count_values": STRING,
    "topk": SCALAR,
    "bottomk": SCALAR,
    "quantile": SCALAR,
    "limitk": SCALAR,
    "limit_ratio": SCALAR,
}
SET_OPERATORS = {"and", "or", "unless"}
COMPARISONS = {"==", "!=", ">", "<", ">=", "<="}
# binary operators, loosest first; ^ is right-associative
PRECEDENCE = [{"or"}, {"and", "unless"}, COMPARISONS, {"+", "-"}, {"*", "/", "%", "atan2"}, {"^"}]
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}
KEYWORDS |= SET_OPERATORS | {"atan2"}
UNITS = ["y", "w", "d", "h", "m", "s", "ms"]
TOKEN = re.compile(
    r"""
    (?P<space>\s+|\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|`[^`]*`)
  | (?P<duration>(?:[0-9]+(?:ms|s|m|h|d|w|y))+)(?![a-zA-Z0-9_.])
  | (?P<number>0[xX][0-9a-fA-F]+|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)(?![a-zA-Z0-9_])
  | (?P<bad>[0-9.][a-zA-Z0-9_.]*)
  | (?P<ident>[a-zA-Z_][a-zA-Z0-9_:]*)
  | (?P<op>==|!=|>=|<=|=~|!~|[-+*/%^<>=(){}\[\],:@])
    """,
    re.X,
)


@dataclass
class Token:
    kind: str
    text: str
    pos: int


def tokenize(expr: str) -> list[Token]:
    tokens, pos = [], 0
    while pos < len(expr):
        m = TOKEN.match(expr, pos)
        if m is None:
            raise PromQLError(f"unexpected character {expr[pos]!r} at {pos} in: {expr}")
        kind = m.lastgroup
        assert kind is not None
        if kind == "bad":
            raise PromQLError(f"bad number or duration {m.group()!r} at {pos} in: {expr}")
        if kind != "space":
            text = m.group()
            if kind == "ident" and text.lower() in ("inf", "nan"):
                kind = "number"
            tokens.append(Token(kind, text, pos))
        pos = m.end()
    tokens.append(Token("end", "", len(expr)))
    opened: list[Token] = []
    for tok in tokens:
        if tok.kind == "op" and tok.text in "([{":
            opened.append(tok)
        elif tok.kind == "op" and tok.text in ")]}":
            if not opened or "([{"[")]}".index(tok.text)] != opened[-1].text:
                raise PromQLError(f"unbalanced {tok.text!r} at {tok.pos} in: {expr}")
            opened.pop()
    if opened:
        raise PromQLError(f"unclosed {opened[-1].text!r} at {opened[-1].pos} in: {expr}")
    return tokens


def check_duration(text: str, expr: str) -> None:
    parts = re.findall(r"([0-9]+)(ms|s|m|h|d|w|y)", text)
    if "".join(n + u for n, u in parts) != text:
        raise PromQLError(f"bad duration {text!r} in: {expr}")
    ranks = [UNITS.index(u) for _, u in parts]
    if ranks != sorted(set(ranks)):
        raise PromQLError(f"bad duration {text!r} (units out of order) in: {expr}")
    if not any(int(n) for n, _ in parts):
        raise PromQLError(f"zero duration {text!r} in: {expr}")


@dataclass
class Node:
    """An expression: ``kind`` is its type; ``metric``, ``matchers`` for a selector;
    ``labels`` the label names of its series (None: unknown without a catalogue)."""

    kind: str
    metric: str | None = None
    matchers: list[tuple[str, str, str]] = field(default_factory=list)
    children: list[Node] = field(default_factory=list)
    labels: frozenset[str] | None = None
    string: str | None = None


# Sample name -> label names of its series as Prometheus stores them.
Catalogue = dict[str, frozenset[str]]


class Parser:
    """A recursive-descent PromQL parser (Prometheus 2.x grammar) with a type check.
    With a catalogue it also infers each expression's label names and refuses metrics
    the catalogue lacks and labels the series cannot have."""

    def __init__(self, expr: str, catalogue: Catalogue | None = None) -> None:
        self.expr = expr
        self.tokens = tokenize(expr)
        self.i = 0
        self.catalogue = catalogue

    # tokens

    @property
    def tok(self) -> Token:
        return self.tokens[self.i]

    def error(self, message: str) -> PromQLError:
        return PromQLError(f"{message} at {self.tok.pos} ({self.tok.text!r}) in: {self.expr}")

    def take(self, text: str | None = None, kind: str | None = None) -> Token:
        tok = self.tok
        if (text is not None and tok.text != text) or (kind is not None and tok.kind != kind):
            raise self.error(f"expected {text or kind}")
        self.i += 1
        return tok

    def at(self, *texts: str) -> bool:
        return self.tok.kind in ("op", "ident") and self.tok.text in texts

    # grammar

    def parse(self) -> Node:
        if self.tok.kind == "end":
            raise self.error("empty expression")
        node = self.binary(0)
        if self.tok.kind != "end":
            raise self.error("unexpected token")
        return node

    def binary(self, level: int) -> Node:
        if level == len(PRECEDENCE):
            return self.unary()
        lhs = self.binary(level + 1)
        while self.at(*PRECEDENCE[level]):
            op = self.take().text
            is_bool = False
            if self.at("bool"):
                self.take()
                if op not in COMPARISONS:
                    raise self.error("bool modifier on a non-comparison")
                is_bool = True
            matching = group = None
            if self.at("on", "ignoring"):
                matching = (self.take().text, self.label_list())
                if self.at("group_left", "group_right"):
                    side = self.take().text
                    extra = self.label_list() if self.at("(") else []
                    group = (side, extra)
            # ^ is right-associative: its right side binds at the same level
            rhs = self.binary(level if op == "^" else level + 1)
            lhs = self.combine(op, lhs, rhs, is_bool, matching, group)
        return lhs

    def combine(self, op, lhs: Node, rhs: Node, is_bool, matching, group) -> Node:
        for side in (lhs, rhs):
            if side.kind not in (SCALAR, VECTOR):
                raise self.error(f"{op} on a {side.kind}")
        vectors = lhs.kind == VECTOR and rhs.kind == VECTOR
        if op in SET_OPERATORS and not vectors:
            raise self.error(f"set operator {op} needs vectors on both sides")
        if (matching or group) and not vectors:
            raise self.error("vector matching between non-vectors")
        if op in COMPARISONS and lhs.kind == rhs.kind == SCALAR and not is_bool:
            raise self.error("comparison between scalars needs bool")
        if group and op in SET_OPERATORS:
            raise self.error("group modifiers on a set operator")
        kind = VECTOR if VECTOR in (lhs.kind, rhs.kind) else SCALAR
        labels = None
        if kind == VECTOR:
            if matching:
                for side in (lhs, rhs):
                    self.need_labels(side, matching[1], f"{matching[0]}(...)")
            if not vectors:
                labels = (lhs if lhs.kind == VECTOR else rhs).labels
            elif op == "or":
                labels = None if None in (lhs.labels, rhs.labels) else lhs.labels | rhs.labels
            elif group and group[0] == "group_right":
                labels = rhs.labels if rhs.labels is None else rhs.labels | set(group[1])
            else:
                labels = (
                    lhs.labels if lhs.labels is None or not group else lhs.labels | set(group[1])
                )
        return Node(kind, children=[lhs, rhs], labels=labels)

    def unary(self) -> Node:
        if self.at("-", "+"):
            self.take()
            node = self.unary()
            if node.kind not in (SCALAR, VECTOR):
                raise self.error(f"unary operator on a {node.kind}")
            return node
        return self.postfix(self.primary())

    def primary(self) -> Node:
        tok = self.tok
        if tok.kind == "number":
            self.take()
            return Node(SCALAR)
        if tok.kind == "string":
            self.take()
            return Node(STRING, string=self.unquote(tok.text))
        if tok.kind == "duration":
            raise self.error("a duration outside of brackets")
        if self.at("("):
            self.take()
            node = self.binary(0)
            self.take(")")
            return node
        if self.at("{"):
            return self.selector(None)
        if tok.kind == "ident":
            name = tok.text
            if name in AGGREGATIONS:
                return self.aggregation()
            if name in KEYWORDS:
                raise self.error(f"unexpected keyword {name}")
            nxt = self.tokens[self.i + 1]
            if nxt.text == "(" and nxt.kind == "op":
                if name not in FUNCTIONS:
                    raise self.error(f"unknown function {name}")
                return self.call()
            self.take()
            return self.selector(name)
        raise self.error("expected an expression")

    def unquote(self, text: str) -> str:
        if text[0] == "`":
            return text[1:-1]
        try:
            return json.loads('"' + text[1:-1].replace('\\"', '"').replace('"', '\\"') + '"')
        except json.JSONDecodeError as e:
            raise self.error(f"bad string {text}: {e}") from None

    def label_name(self) -> str:
        tok = self.take(kind="ident")
        if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", tok.text):
            raise PromQLError(f"bad label name {tok.text!r} in: {self.expr}")
        return tok.text

    def label_list(self) -> list[str]:
        self.take("(")
        names = []
        while not self.at(")"):
            names.append(self.label_name())
            if not self.at(")"):
                self.take(",")
        self.take(")")
        return names

    def selector(self, name: str | None) -> Node:
        matchers: list[tuple[str, str, str]] = []
        if self.at("{"):
            self.take("{")
            while not self.at("}"):
                label = self.label_name()
                if not self.at("=", "!=", "=~", "!~"):
                    raise self.error(f"expected a matcher operator after {label}")
                op = self.take().text
                value = self.unquote(self.take(kind="string").text)
                if op in ("=~", "!~"):
                    try:
                        re.compile(value)
                    except re.error as e:
                        raise self.error(f"bad regular expression {value!r}: {e}") from None
                matchers.append((label, op, value))
                if not self.at("}"):
                    self.take(",")
            self.take("}")
        if name is None:
            names = [v for label, op, v in matchers if label == "__name__" and op == "="]
            name = names[0] if names else None
            if all(matches_empty(op, value) for _, op, value in matchers):
                raise self.error("a selector must have a matcher that does not match ''")
        labels = None
        if self.catalogue is not None:
            if name is None:
                raise self.error("a selector without a metric name")
            labels = self.catalogue_labels(name)
            for label, _, _ in matchers:
                if label != "__name__" and label not in labels:
                    raise PromQLError(
                        f"{name} has no label {label!r} (it has {sorted(labels)}) in: {self.expr}"
                    )
        return Node(VECTOR, metric=name, matchers=matchers, labels=labels)

    def catalogue_labels(self, name: str) -> frozenset[str]:
        assert self.catalogue is not None
        if name not in self.catalogue:
            near = sorted(n for n in self.catalogue if n.startswith(name) or name.startswith(n))
            hint = f"; the exposition has {near}" if near else ""
            raise PromQLError(f"metric {name} is not in any /metrics output{hint}: {self.expr}")
        return self.catalogue[name]

    def postfix(self, node: Node) -> Node:
        while True:
            if self.at("["):
                self.take("[")
                duration = self.take(kind="duration").text
                check_duration(duration, self.expr)
                if self.at(":"):  # a subquery
                    self.take(":")
                    if self.tok.kind == "duration":
                        check_duration(self.take().text, self.expr)
                    if node.kind != VECTOR:
                        raise self.error(f"subquery of a {node.kind}")
                elif node.kind != VECTOR or node.metric is None or node.children:
                    raise self.error("a range of something that is not a vector selector")
                self.take("]")
                node = Node(MATRIX, metric=node.metric, children=[node], labels=node.labels)
            elif self.at("offset"):
                self.take()
                if self.at("-"):
                    self.take()
                check_duration(self.take(kind="duration").text, self.expr)
                if node.kind not in (VECTOR, MATRIX):
                    raise self.error(f"offset of a {node.kind}")
            elif self.at("@"):
                self.take()
                if self.at("start", "end"):
                    self.take()
                    self.take("(")
                    self.take(")")
                else:
                    self.take(kind="number")
            else:
                return node

    def arguments(self) -> list[Node]:
        self.take("(")
        args = []
        while not self.at(")"):
            args.append(self.binary(0))
            if not self.at(")"):
                self.take(",")
        self.take(")")
        return args

    def call(self) -> Node:
        name = self.take().text
        args = self.arguments()
        wanted, returns = FUNCTIONS[name]
        required = list(wanted[: wanted.index(OPT)] if OPT in wanted else wanted)
        allowed = [t for t in wanted if t != OPT]
        if "..." in wanted:
            required, allowed = required[:-1], allowed[:-1]
            allowed += [allowed[-1]] * max(0, len(args) - len(allowed))
        if not len(required) <= len(args) <= len(allowed):
            raise self.error(f"{name}() takes {len(required)}..{len(allowed)} arguments")
        for n, (arg, kind) in enumerate(zip(args, allowed, strict=False)):
            if arg.kind != kind:
                raise self.error(f"{name}() argument {n + 1} must be a {kind}, not a {arg.kind}")
        labels = args[0].labels if args and args[0].kind in (VECTOR, MATRIX) else frozenset()
        if labels is not None:
            if name == "histogram_quantile":
                self.need_labels(args[1], ["le"], name)
                labels = args[1].labels
                labels = None if labels is None else labels - {"le"}
            elif name == "label_replace":
                self.need_labels(args[0], [args[3].string or ""], name)
                labels = labels | {args[1].string or ""}
            elif name == "label_join":
                self.need_labels(args[0], [a.string or "" for a in args[3:]], name)
                labels = labels | {args[1].string or ""}
            elif name in ("absent", "absent_over_time"):
                labels = None
        return Node(returns, children=args, labels=labels if returns == VECTOR else None)

    def aggregation(self) -> Node:
        name = self.take().text
        grouping: tuple[str, list[str]] | None = None
        if self.at("by", "without"):
            grouping = (self.take().text, self.label_list())
        args = self.arguments()
        if self.at("by", "without"):
            if grouping:
                raise self.error("two grouping clauses")
            grouping = (self.take().text, self.label_list())
        param = AGGREGATIONS[name]
        kinds = [VECTOR] if param is None else [param, VECTOR]
        if [a.kind for a in args] != kinds:
            raise self.error(f"{name} takes ({', '.join(kinds)}), not {[a.kind for a in args]}")
        vector = args[-1]
        labels = vector.labels
        if grouping and grouping[0] == "by":
            self.need_labels(vector, grouping[1], f"{name} by")
            labels = frozenset(grouping[1])
        elif grouping:
            labels = None if labels is None else labels - set(grouping[1])
        else:
            labels = frozenset()
        if name == "count_values" and labels is not None:
            labels = labels | {args[0].string or ""}
        if name in ("topk", "bottomk", "limitk", "limit_ratio"):
            labels = vector.labels
        return Node(VECTOR, children=args, labels=labels)

    def need_labels(self, node: Node, names: list[str], where: str) -> None:
        if node.labels is None:
            return
        missing = [n for n in names if n not in node.labels]
        if missing:
            raise PromQLError(
                f"{where}: the series have no label {missing} (they have "
                f"{sorted(node.labels)}) in: {self.expr}"
            )


def matches_empty(op: str, value: str) -> bool:
    """Whether a label matcher selects series without the label."""
    return {
        "=": value == "",
        "!=": value != "",
        "=~": re.fullmatch(value, "") is not None,
        "!~": re.fullmatch(value, "") is None,
    }[op]


def parse_promql(expr: str, catalogue: Catalogue | None = None) -> Node:
    return Parser(expr, catalogue).parse()


def metric_names(node: Node) -> set[str]:
    names = {node.metric} if node.metric else set()
    for child in node.children:
        names |= metric_names(child)
    return names


# --- the dashboard ----------------------------------------------------------------------

# Grafana's interval variables, as a range would have them.
GRAFANA_INTERVALS = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}


def dashboard_variables(dashboard: dict) -> set[str]:
    return {v["name"] for v in dashboard["templating"]["list"]}


def grafana_expr(expr: str, variables: set[str]) -> str:
    """A dashboard query as Prometheus would get it: interval variables replaced; every
    other variable must be one the dashboard defines (they sit in matcher strings)."""
    for name in re.findall(r"\$\{?(\w+)", expr):
        if name not in GRAFANA_INTERVALS and name not in variables:
            raise PromQLError(f"${name} is not a variable of the dashboard: {expr}")
    for name, value in GRAFANA_INTERVALS.items():
        expr = expr.replace("${" + name + "}", value).replace("$" + name, value)
    return expr


def panels(dashboard: dict) -> Iterator[dict]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def dashboard_queries(dashboard: dict) -> list[tuple[str, str, str]]:
    """(panel title, query as Prometheus gets it, legend format) of every target."""
    variables = dashboard_variables(dashboard)
    return [
        (p["title"], grafana_expr(t["expr"], variables), t.get("legendFormat", ""))
        for p in panels(dashboard)
        for t in p["targets"]
    ]


def check_dashboard(dashboard: dict) -> None:
    assert dashboard["schemaVersion"] >= 36
    assert dashboard["uid"] and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    source = variables["datasource"]
    assert (source["type"], source["query"]) == ("datasource", "prometheus")
    for name in ("namespace", "waltz_cluster"):
        assert variables[name]["type"] == "query"
        assert variables[name]["datasource"]["uid"] == "${datasource}"
        query = variables[name]["query"]
        query = query["query"] if isinstance(query, dict) else query
        m = re.fullmatch(r"label_values\((.*), *(\w+)\)", query)
        assert m and m.group(2) == ("waltz_namespace" if name == "namespace" else name), query
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    assert ids, "no panels"
    for panel in panels(dashboard):
        title = panel.get("title")
        assert title, panel
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, title
        assert panel["targets"], f"panel {title!r} has no targets"
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"]), title
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), title
        for target in panel["targets"]:
            assert target.get("expr"), f"panel {title!r}: a target without expr"
            assert target.get("datasource", panel["datasource"]) == panel["datasource"], title


def label_queries(dashboard: dict) -> list[str]:
    """The metric selectors inside the variables' label_values(...) queries."""
    out = []
    for v in dashboard["templating"]["list"]:
        query = v.get("query")
        query = query.get("query") if isinstance(query, dict) else query
        m = re.fullmatch(r"label_values\((.*), *(\w+)\)", query or "")
        if m:
            out.append(grafana_expr(m.group(1), dashboard_variables(dashboard)))
    return out


def test_the_dashboard_loads_and_every_panel_has_a_data_source_and_queries():
    dashboard = json.loads(DASHBOARD.read_text())
    check_dashboard(dashboard)
    titles = " / ".join(p["title"] for p in panels(dashboard)).lower()
    for wanted in (
        "quorum",
        "live replicas vs assigned",
        "commit rate",
        "commit latency",
        "high-water mark",
        "replica lag",
        "feed clients",
        "disk free",
        "fsync latency",
        "reconciles",
    ):
        assert wanted in titles, wanted
    for title, expr, _ in dashboard_queries(dashboard):
        node = parse_promql(expr)
        assert node.kind == VECTOR, (title, expr)
        for selector in selectors(node):
            names = {label for label, _, _ in selector.matchers}
            assert {"waltz_namespace", "waltz_cluster"} <= names, (title, expr)
    for query in label_queries(dashboard):
        assert parse_promql(query).kind == VECTOR


def selectors(node: Node) -> Iterator[Node]:
    if node.metric and not node.children:
        yield node
    for child in node.children:
        yield from selectors(child)


def test_every_alert_expression_parses(namespaced, cluster_wide):
    for rendered in (namespaced, cluster_wide):
        for alert in rules(rendered):
            node = parse_promql(alert["expr"])
            assert node.kind == VECTOR, alert["alert"]
            assert metric_names(node), alert["alert"]


# Each check on broken input: it must fail, and say what is wrong.
TOY = frozenset({"partition", "pod", "waltz_cluster", "waltz_namespace"})
TOY_CATALOGUE: Catalogue = {
    "waltz_server_partition_committed_total": TOY,
    "waltz_server_commit_seconds_bucket": TOY | {"le"},
}


@pytest.mark.parametrize(
    ("expr", "catalogue", "message"),
    [
        ("rate(waltz_server_partition_committed_total[5m]", None, "unclosed '(' at 4"),
        ("sum(rate(x[5m])))", None, "unbalanced ')' at 16"),
        ("sum(rate(x[5m)))", None, "unbalanced ')' at 13"),
        ('x{partition="0"', None, "unclosed '{'"),
        ("(x + y) z", None, "unexpected token"),
        ("rated(x[5m])", None, "unknown function rated"),
        ("summ by (partition) (x)", None, "unexpected token"),
        ("rate(x[5mm])", None, "bad number or duration '5mm'"),
        ("rate(x[5])", None, "expected duration"),
        ("rate(x[30m1h])", None, "units out of order"),
        ("rate(x[0s])", None, "zero duration"),
        ("x{partition=0}", None, "expected string"),
        ('x{partition~"0"}', None, "unexpected character '~'"),
        ('x{partition>"0"}', None, "expected a matcher operator"),
        ('x{partition=~"("}', None, "bad regular expression"),
        ('{partition=~".*"}', None, "does not match ''"),
        ("rate(x)", None, "must be a range vector"),
        ("histogram_quantile(x, 0.99)", None, "must be a scalar"),
        ("sum by (partition) x", None, "expected ("),
        ("x and 1", None, "needs vectors"),
        ("1 > 2", None, "needs bool"),
        ("x > bool", None, "expected an expression"),
        ("x + on (pod group_left) y", None, "expected ,"),
        ("rate(x[5m] offset 1x)", None, "bad number or duration '1x'"),
        ("rate(x[5m] offset 5)", None, "expected duration"),
        ("rate(x[5m:1x])", None, "bad number or duration '1x'"),
        ("x $ y", None, "unexpected character"),
        (
            "rate(waltz_server_partition_comitted_total[5m])",
            TOY_CATALOGUE,
            "metric waltz_server_partition_comitted_total is not in any /metrics output",
        ),
        (
            "waltz_server_commit_seconds",
            TOY_CATALOGUE,
            "the exposition has ['waltz_server_commit_seconds_bucket']",
        ),
        (
            "sum by (partiton) (rate(waltz_server_partition_committed_total[5m]))",
            TOY_CATALOGUE,
            "no label ['partiton']",
        ),
        (
            'waltz_server_partition_committed_total{cluster="a"}',
            TOY_CATALOGUE,
            "has no label 'cluster'",
        ),
        (
            "histogram_quantile(0.5, sum by (partition) "
            "(rate(waltz_server_commit_seconds_bucket[5m])))",
            TOY_CATALOGUE,
            "no label ['le']",
        ),
        (
            "waltz_server_partition_committed_total unless on (replica) "
            "waltz_server_partition_committed_total",
            TOY_CATALOGUE,
            "no label ['replica']",
        ),
    ],
)
def test_a_broken_expression_is_refused_saying_why(expr, catalogue, message):
    with pytest.raises(PromQLError) as caught:
        parse_promql(expr, catalogue)
    assert message in str(caught.value), str(caught.value)


def test_the_parser_takes_the_rest_of_promql():
    for expr in (
        "-x ^ 2 ^ 3 % 4 atan2 y",
        "sum without (pod) (x) / ignoring (pod) group_left (owner) y",
        'count_values("v", x) or topk(3, x) unless bottomk by (a) (2, x)',
        "max_over_time(rate(x[5m])[1h:1m]) offset 1d",
        "x @ 1700000000 + x @ start() - vector(1) * scalar(y)",
        "histogram_quantile(0.9, sum by (le) (rate(x_bucket[1h30m])))",
        'label_join(x, "d", ",", "a", "b") > bool 0',
        "quantile(0.5, x) == on () group_right () y",
        "day_of_week() + time() * pi() + clamp(x, 0, Inf) + NaN + 0x1F + 1e3",
        'sort_by_label(x, "a", "b") # a comment',
    ):
        parse_promql(expr)


def test_a_broken_dashboard_or_runbook_is_refused(namespaced):
    dashboard = json.loads(DASHBOARD.read_text())
    broken = copy.deepcopy(dashboard)
    del broken["panels"][0]["datasource"]
    with pytest.raises(KeyError):
        check_dashboard(broken)
    broken = copy.deepcopy(dashboard)
    broken["panels"][-1]["targets"] = []
    with pytest.raises(AssertionError, match="has no targets"):
        check_dashboard(broken)
    broken = copy.deepcopy(dashboard)
    broken["panels"][0]["targets"][0]["expr"] = 'x{waltz_cluster=~"$cluster"}'
    with pytest.raises(PromQLError, match=r"\$cluster is not a variable"):
        dashboard_queries(broken)
    alerts = rules(namespaced)
    operations = OPERATIONS.read_text()
    renamed = operations.replace("### WaltzStorageDiskFilling", "### WaltzDiskFilling")
    with pytest.raises(AssertionError, match="subsections differ"):
        check_runbooks(alerts, renamed)
    moved = copy.deepcopy(alerts)
    moved[0]["annotations"]["runbook_url"] = RUNBOOKS + "quorum-lost"
    with pytest.raises(AssertionError):
        check_runbooks(moved, operations)
    with pytest.raises(AssertionError, match="lacks"):
        check_runbooks(alerts, operations + "\nSee [nowhere](#no-such-runbook).\n")
    with pytest.raises(AssertionError, match="unexpected template action"):
        check_alert_template("{{ $labels.partition }} {{ .Labels.pod }}")
    monitor = copy.deepcopy(namespaced.cluster_monitor)
    monitor["spec"]["podMetricEndpoints"] = monitor["spec"].pop("podMetricsEndpoints")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(monitor, POD_MONITOR_SCHEMA)
    rule = copy.deepcopy(namespaced.rule)
    del rule["spec"]["groups"][0]["rules"][0]["annotations"]["runbook_url"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(rule, PROMETHEUS_RULE_SCHEMA)
    # A PodMonitor that no longer names the cluster, or selects other pods.
    for breaking in (
        lambda m: m["spec"]["podMetricsEndpoints"][0]["relabelings"].pop(0),
        lambda m: m["spec"]["selector"]["matchLabels"].update({"app.kubernetes.io/name": "x"}),
        lambda m: m["spec"]["podMetricsEndpoints"][0].update(port="metrics"),
    ):
        rendered = Rendered(copy.deepcopy(namespaced.objects))
        breaking(rendered.cluster_monitor)
        with pytest.raises((AssertionError, KeyError)):
            check_pod_monitors(rendered, ["waltz", "team-a", "team-b"])


# --- the metrics the expressions use, against real /metrics output ----------------------


class Put(TransactionContext):
    def __init__(self, partition: int) -> None:
        self.partition = partition

    def partition_id(self, num_partitions: int) -> int:
        return self.partition

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_data(b"monitored")
        return True


async def wait_for(what: str, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


def exposition(text: str, extra: dict[str, str], relabelings: list[dict]) -> Catalogue:
    """Sample name -> label names, as Prometheus stores the scraped series: the target's
    labels added, then the metric relabelings applied."""
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            # Target labels win over the series' own (honorLabels is off).
            labels = relabel({**sample.labels, **extra}, relabelings)
            out.setdefault(sample.name, set()).update(k for k, v in labels.items() if v)
    return {name: frozenset(labels) for name, labels in out.items()}


def merge(*catalogues: Catalogue) -> Catalogue:
    out: dict[str, frozenset[str]] = {}
    for catalogue in catalogues:
        for name, labels in catalogue.items():
            out[name] = out.get(name, frozenset()) | labels
    return out


def test_every_metric_and_label_the_alerts_and_dashboard_use_is_exported(make_cluster, namespaced):
    cluster = make_cluster(partitions=2)
    addresses = cluster.layout.storage_addresses
    ready_urls = {
        address: f"http://127.0.0.1:{http_port}/readyz"
        for address, (_, http_port) in zip(addresses, cluster.layout.storage_ports, strict=True)
    }
    label = f"{NAMESPACE}/waltz"

    async def scrape() -> tuple[list[str], list[str], str]:
        config = WaltzClientConfig(
            cluster.zookeeper_connect, zk_root=cluster.layout.root, feed=False, request_timeout=5.0
        )
        async with WaltzClient(config) as client:
            results = await asyncio.gather(*(client.submit(Put(p % 2)) for p in range(20)))
        assert {r.status for r in results} == {SubmitStatus.COMMITTED}, results

        metrics = OperatorMetrics()
        figures = metrics.figures(label)
        monitor: ClusterMonitor

        def on_view(view: ClusterView | None) -> None:
            figures.view = view
            figures.zookeeper_reachable = monitor.zookeeper_error is None

        settings = MonitorSettings(scrape_interval=0.5, scrape_timeout=3.0)
        monitor = ClusterMonitor(
            cluster.zookeeper_connect, cluster.layout.root, ready_urls.get, settings, on_view
        )
        try:
            await wait_for(
                "the operator's view of both partitions with a quorum",
                lambda: (
                    figures.view is not None
                    and len(figures.view.partitions) == 2
                    and all(p.quorum for p in figures.view.partitions)
                ),
            )
        finally:
            await monitor.close()
        # What a reconcile records (reconcile.py): a count, a duration, an error, a refusal.
        metrics.reconciles.labels(label).inc()
        metrics.reconcile_errors.labels(label).inc()
        metrics.refusals.labels(label).inc()
        metrics.reconcile_seconds.labels(label).observe(0.2)
        async with TestClient(TestServer(metrics.app())) as http:
            response = await http.get("/metrics")
            assert response.status == 200
            operator_text = await response.text()
        async with aiohttp.ClientSession() as session:

            async def get(port: int) -> str:
                async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
                    assert response.status == 200
                    return await response.text()

            storage = [await get(s.ready["http_port"]) for s in cluster.storages]
            servers = [await get(s.ready["http_port"]) for s in cluster.servers]
        return storage, servers, operator_text

    storage, servers, operator_text = asyncio.run(scrape())
    pods = namespaced.waltz_pods()
    clusters, operator = namespaced.cluster_monitor, namespaced.operator_monitor
    operator_pod = {**namespaced.operator_pod}
    operator_pod["metadata"] = {**operator_pod["metadata"], "namespace": NAMESPACE}
    catalogue = merge(
        *(exposition(t, target_labels(clusters, pods["storage"], "http"), []) for t in storage),
        *(exposition(t, target_labels(clusters, pods["server"], "http"), []) for t in servers),
        exposition(
            operator_text,
            target_labels(operator, operator_pod, "metrics"),
            metric_relabelings(operator),
        ),
    )

    used: dict[str, set[str]] = {}
    for alert in rules(namespaced):
        node = parse_promql(alert["expr"], catalogue)  # unknown metrics and labels raise
        assert node.labels is not None
        for name in metric_names(node):
            used.setdefault(name, set()).add(alert["alert"])
        for text in alert["annotations"].values():
            for name in re.findall(r"\$labels\.(\w+)", text):
                assert name in node.labels, (
                    f"{alert['alert']}: its annotations name $labels.{name}, which its "
                    f"expression's series lack (they have {sorted(node.labels)})"
                )
    dashboard = json.loads(DASHBOARD.read_text())
    for title, expr, legend in dashboard_queries(dashboard):
        node = parse_promql(expr, catalogue)
        assert node.labels is not None
        for name in metric_names(node):
            used.setdefault(name, set()).add(f"panel {title!r}")
        for name in re.findall(r"\{\{\s*(\w+)\s*\}\}", legend):
            assert name in node.labels, (
                f"panel {title!r}: legend {{{{{name}}}}} is not a label of {expr} "
                f"(it has {sorted(node.labels)})"
            )
    for query in label_queries(dashboard):
        parse_promql(query, catalogue)
    # The expressions cover each tier (a sanity check of the check itself).
    for prefix in ("waltz_storage_", "waltz_server_", "waltz_operator_"):
        assert any(n.startswith(prefix) for n in used), prefix
    assert "waltz_storage_disk_free_bytes" in used and "waltz_storage_disk_size_bytes" in used
    assert "waltz_operator_reconcile_errors_total" in used
    # The same catalogue refuses a misspelt metric, a histogram without its suffix, and a
    # label the series do not have.
    for expr, message in (
        ("rate(waltz_server_partition_comitted_total[5m])", "not in any /metrics output"),
        ("waltz_storage_fsync_seconds > 1", "the exposition has ['waltz_storage_fsync_seconds_"),
        ('waltz_operator_partition_quorum{partition="0", node="a"}', "has no label 'node'"),
    ):
        with pytest.raises(PromQLError, match=re.escape(message)):
            parse_promql(expr, catalogue)
