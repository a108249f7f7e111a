"""The objects a WaltzCluster wants: valid for Kubernetes, hardened, and shaped for a
quorum system (stable storage addresses, operator-driven storage rolls, budgets that
keep every partition's majority)."""

from __future__ import annotations

import copy
import pathlib

import kubernetes_validate
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from waltz_operator.desired import (
    desired_objects,
    selector_string,
    storage_disruption_budget,
)
from waltz_operator.spec import SpecError, parse

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = {
    p.stem: yaml.safe_load(p.read_text()) for p in (ROOT / "examples").glob("waltzcluster-*.yaml")
}


def resource(**spec) -> dict:
    doc = copy.deepcopy(EXAMPLES["waltzcluster-minimal"])
    doc["metadata"].update(namespace="prod", uid="8d0c1f4e-0000-4000-8000-000000000001")
    doc["spec"].update(spec)
    return doc


SPECS = {
    "minimal": resource(),
    "production": {
        **EXAMPLES["waltzcluster-production"],
        "metadata": {**EXAMPLES["waltzcluster-production"]["metadata"], "uid": "u-1"},
    },
    "one-replica": resource(replicasPerPartition=1, storage={"replicas": 1}),
    "five-replicas": resource(replicasPerPartition=5, storage={"replicas": 7}),
    "drop-volumes": resource(retainVolumes=False, image={"pullSecrets": ["a", "b"]}),
    "plain": resource(tls={"mode": "disabled"}, networkPolicy={"enabled": False}),
    "json-logs": resource(logFormat="json"),
    "network-policy": resource(
        networkPolicy={
            "enabled": True,
            "clientsFrom": [{"podSelector": {"matchLabels": {"role": "payments"}}}],
            "metricsFrom": [
                {"namespaceSelector": {"matchLabels": {"name": "monitoring"}}},
            ],
        }
    ),
    "tls": {
        **EXAMPLES["waltzcluster-tls"],
        "metadata": {**EXAMPLES["waltzcluster-tls"]["metadata"], "namespace": "prod"},
    },
}


def by_kind(objects: list[dict]) -> dict[str, list[dict]]:
    kinds: dict[str, list[dict]] = {}
    for o in objects:
        kinds.setdefault(o["kind"], []).append(o)
    return kinds


@pytest.mark.parametrize("kubernetes", ["1.30.0", "1.34.0"])
@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_object_is_valid_for_kubernetes(name, kubernetes):
    for obj in desired_objects(parse(SPECS[name])):
        kubernetes_validate.validate(obj, kubernetes, strict=True)


def test_storage_nodes_are_addressed_by_their_stable_names():
    spec = parse(resource(storage={"replicas": 4}))
    assert spec.storage_addresses() == [
        f"demo-storage-{i}.demo-storage.prod.svc:55280" for i in range(4)
    ]
    statefulset = by_kind(desired_objects(spec))["StatefulSet"][0]
    env = {e["name"]: e for e in statefulset["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["WALTZ_STORAGE_ADVERTISED_ADDRESS"]["value"] == (
        "$(POD_NAME).demo-storage.prod.svc:55280"
    )
    assert statefulset["spec"]["serviceName"] == "demo-storage"
    service = next(
        s
        for s in by_kind(desired_objects(spec))["Service"]
        if s["metadata"]["name"] == "demo-storage"
    )
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"]


def test_storage_is_rolled_by_the_operator_and_servers_one_at_a_time():
    objects = by_kind(desired_objects(parse(resource())))
    assert objects["StatefulSet"][0]["spec"]["updateStrategy"] == {"type": "OnDelete"}
    strategy = objects["Deployment"][0]["spec"]["strategy"]
    assert strategy["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}


@pytest.mark.parametrize(("replicas", "budget"), [(1, 1), (3, 1), (5, 2), (7, 3)])
def test_the_storage_budget_keeps_every_partitions_majority(replicas, budget):
    """One replica has no majority to keep: its budget is 1, never 0, which would block
    every drain of a node forever."""
    spec = parse(resource(replicasPerPartition=replicas, storage={"replicas": 7}))
    pdbs = {
        p["metadata"]["name"]: p["spec"]
        for p in by_kind(desired_objects(spec))["PodDisruptionBudget"]
    }
    assert pdbs["demo-storage"]["maxUnavailable"] == budget
    assert pdbs["demo-server"]["maxUnavailable"] == 1
    assert "minAvailable" not in pdbs["demo-server"]  # one server: drains still go on


@given(st.integers(3, 7).filter(lambda r: r % 2 == 1), st.data())
@settings(max_examples=50)
def test_any_budgeted_set_of_down_pods_leaves_every_partition_a_majority(rpp, data):
    """Whatever storage pods hold a partition's replicas, taking down at most the budget
    of them leaves that partition a majority."""
    budget = storage_disruption_budget(rpp)
    pods = data.draw(st.integers(rpp, 12))
    replicas = data.draw(
        st.lists(st.integers(0, pods - 1), min_size=rpp, max_size=rpp, unique=True)
    )
    down = data.draw(st.lists(st.integers(0, pods - 1), max_size=budget, unique=True))
    assert len([r for r in replicas if r not in down]) >= rpp // 2 + 1


def test_pods_are_hardened():
    for obj in desired_objects(parse(SPECS["production"])):
        if obj["kind"] not in ("StatefulSet", "Deployment"):
            continue
        pod = obj["spec"]["template"]["spec"]
        assert pod["enableServiceLinks"] is False
        assert pod["securityContext"]["runAsNonRoot"] is True
        (container,) = pod["containers"]
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"]
        assert security["capabilities"] == {"drop": ["ALL"]}
        paths = {p["httpGet"]["path"] for k, p in container.items() if k.endswith("Probe")}
        assert paths == {"/readyz", "/healthz"}
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert "/tmp" in mounts  # writable paths are volumes


def test_everything_is_owned_by_the_resource_and_labelled():
    spec = parse(resource())
    for obj in desired_objects(spec):
        (owner,) = obj["metadata"]["ownerReferences"]
        assert owner["uid"] == spec.uid and owner["kind"] == "WaltzCluster" and owner["controller"]
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == "demo"
        assert labels["app.kubernetes.io/managed-by"] == "waltz-operator"
    assert selector_string(spec, "storage") == (
        "app.kubernetes.io/instance=demo,app.kubernetes.io/component=storage"
    )


@pytest.mark.parametrize(("retain", "policy"), [(True, "Retain"), (False, "Delete")])
def test_volumes_follow_retain_volumes(retain, policy):
    statefulset = by_kind(desired_objects(parse(resource(retainVolumes=retain))))["StatefulSet"][0]
    assert statefulset["spec"]["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": policy,
        "whenScaled": policy,
    }


def test_user_settings_reach_the_daemons_as_their_variables():
    spec = parse(SPECS["production"])
    objects = by_kind(desired_objects(spec))
    maps = {m["metadata"]["name"]: m["data"] for m in objects["ConfigMap"]}
    for kind, component in (("StatefulSet", "storage"), ("Deployment", "server")):
        container = objects[kind][0]["spec"]["template"]["spec"]["containers"][0]
        assert container["envFrom"] == [{"configMapRef": {"name": f"payments-{component}-config"}}]
    storage_env = maps["payments-storage-config"]
    server_env = maps["payments-server-config"]
    assert storage_env["WALTZ_STORAGE_SEGMENT_BYTES"] == "1GiB"
    assert server_env["WALTZ_SERVER_LOCK_TABLE_SIZE"] == "1048576"
    assert storage_env["WALTZ_STORAGE_ZK_ROOT"] == "/waltz/payments"
    assert server_env["WALTZ_SERVER_ZOOKEEPER"].startswith("zk-0.zk.zookeeper.svc:2181,")
    claim = objects["StatefulSet"][0]["spec"]["volumeClaimTemplates"][0]["spec"]
    assert claim["storageClassName"] == "fast-ssd"
    assert claim["resources"]["requests"]["storage"] == "200Gi"


def test_a_settings_change_changes_the_pod_template_so_the_pods_roll():
    def hashes(resource_doc) -> list[str]:
        objects = by_kind(desired_objects(parse(resource_doc)))
        return [
            objects[kind][0]["spec"]["template"]["metadata"]["annotations"]["waltz.io/config-hash"]
            for kind in ("StatefulSet", "Deployment")
        ]

    base = copy.deepcopy(SPECS["production"])
    changed = copy.deepcopy(base)
    changed["spec"]["storage"]["settings"]["segment_bytes"] = "2GiB"
    changed["spec"]["server"]["settings"]["lock_table_size"] = "2048"
    before, after = hashes(base), hashes(changed)
    assert before == hashes(copy.deepcopy(base))  # deterministic
    assert before[0] != after[0] and before[1] != after[1]


def test_the_default_root_is_derived_from_namespace_and_name():
    assert parse(resource()).zk_root == "/waltz/prod/demo"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda r: r["spec"].update(replicasPerPartition=2),
            "spec.replicasPerPartition must be odd",
        ),
        (
            lambda r: r["spec"].update(storage={"replicas": 2}),
            "spec.storage.replicas (2) must be at least",
        ),
        (lambda r: r["spec"].pop("zookeeper"), "spec.zookeeper.connect is required"),
        (lambda r: r["spec"].update(partitions="8"), "spec.partitions must be an integer"),
        (
            lambda r: r["spec"].update(server={"settings": {"x": 1}}),
            "spec.server.settings.x must be a string",
        ),
    ],
    ids=["even", "too-few-storage", "no-zookeeper", "string-partitions", "setting-type"],
)
def test_what_reached_the_operator_anyway_is_refused_naming_the_field(change, message):
    doc = resource()
    change(doc)
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse(doc)


def test_tls_and_zookeeper_secrets_reach_the_daemons_as_files_they_load(tmp_path):
    """The Secrets are mounted read-only, and the settings that point at them are ones
    the daemons take: each tier's ConfigMap, with the mounts played by copies of real
    certificates, loads as the daemon's own configuration would."""
    from waltz_client.tools.local.certs import local_pki
    from waltz_server.config import load_config as load_server_config
    from waltz_storage.config import load_config as load_storage_config

    objects = by_kind(desired_objects(parse(SPECS["tls"])))
    maps = {m["metadata"]["name"]: m["data"] for m in objects["ConfigMap"]}
    pki = local_pki(str(tmp_path / "pki"), {"waltz-server": ["127.0.0.1"]})["waltz-server"]
    (tmp_path / "data").mkdir()

    def mounted(kind: str) -> tuple[dict, dict[str, str]]:
        pod = objects[kind][0]["spec"]["template"]["spec"]
        volumes = {v["name"]: v["secret"] for v in pod["volumes"] if "secret" in v}
        mounts = {}
        for m in pod["containers"][0]["volumeMounts"]:
            if m["name"] in volumes:
                assert m.get("readOnly") is True and "subPath" not in m  # rotations arrive
                assert volumes[m["name"]]["defaultMode"] == 0o440
                mounts[m["mountPath"]] = volumes[m["name"]]["secretName"]
        return volumes, mounts

    def as_mounted(env: dict[str, str]) -> dict[str, str]:
        """The ConfigMap's paths, pointing at files that stand in for the mounts."""
        out = {}
        for name, value in env.items():
            if value.startswith("/etc/waltz/"):
                local = tmp_path / value.lstrip("/")
                local.parent.mkdir(parents=True, exist_ok=True)
                source = {"tls.crt": pki.cert, "tls.key": pki.key, "ca.crt": pki.ca}
                if local.name in source:
                    local.write_bytes(pathlib.Path(source[local.name]).read_bytes())
                else:
                    local.write_text("waltz:s3cret\n")  # the credential
                value = str(local)
            elif value == "/var/lib/waltz/storage":
                value = str(tmp_path / "data")
            out[name] = value
        return out

    _, storage_mounts = mounted("StatefulSet")
    assert storage_mounts == {
        "/etc/waltz/tls": "secure-storage-tls",
        "/etc/waltz/zk-tls": "secure-zk-tls",
    }  # no ZooKeeper credential: storage nodes only read the metadata
    server_volumes, server_mounts = mounted("Deployment")
    assert server_mounts == {
        "/etc/waltz/tls": "secure-server-tls",
        "/etc/waltz/zk-tls": "secure-zk-tls",
        "/etc/waltz/zk-auth": "secure-zk-auth",
    }
    assert server_volumes["zk-auth"]["items"] == [{"key": "credential", "path": "credential"}]

    storage = load_storage_config([], as_mounted(maps["secure-storage-config"]))
    assert storage.tls.enabled and storage.tls.verify_peer
    assert storage.tls_allowed_peers == ("waltz-server",)
    assert storage.zk_tls is not None
    server = load_server_config([], as_mounted(maps["secure-server-config"]))
    assert server.tls.enabled and server.tls.verify_peer
    assert server.storage_tls.enabled and server.storage_tls.cert == server.tls.cert
    # Dialled at the pod IP, a server is checked for the client Service's name
    # (tests/k8s/test_tls_names.py does the handshakes).
    assert server.advertised_tls_name == "secure.prod.svc"
    assert server.zk_tls is not None
    assert server.zk_credential is not None and server.zk_credential.user == "waltz"


def test_without_tls_no_secret_is_mounted():
    objects = by_kind(desired_objects(parse(SPECS["plain"])))
    for kind in ("StatefulSet", "Deployment"):
        pod = objects[kind][0]["spec"]["template"]["spec"]
        assert not [v for v in pod["volumes"] if "secret" in v]
    for data in (m["data"] for m in objects["ConfigMap"]):
        assert not [k for k in data if "TLS" in k or "AUTH" in k]


def test_network_policies_allow_only_the_links_each_tier_needs():
    objects = by_kind(desired_objects(parse(SPECS["network-policy"])))
    policies = {p["metadata"]["name"]: p["spec"] for p in objects["NetworkPolicy"]}
    storage, server = policies["demo-storage"], policies["demo-server"]
    assert storage["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "storage"
    assert storage["policyTypes"] == ["Ingress"]
    by_port = {r["ports"][0]["port"]: r.get("from") for r in storage["ingress"]}
    servers = {"podSelector": {"matchLabels": selector_labels("server")}}
    operator = {
        "namespaceSelector": {},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "waltz-operator"}},
    }
    # The storage protocol: this cluster's servers, and the operator's pods only.
    assert by_port[55280] == [servers, operator]
    monitoring = {"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}
    assert by_port[55281] == [monitoring, operator]
    by_port = {r["ports"][0]["port"]: r.get("from") for r in server["ingress"]}
    assert by_port[55180] == [{"podSelector": {"matchLabels": {"role": "payments"}}}]
    assert by_port[55181] == [monitoring, operator]
    assert len(storage["ingress"]) == len(server["ingress"]) == 2  # no other port


def test_without_network_policy_the_policies_allow_everything():
    objects = by_kind(desired_objects(parse(SPECS["plain"])))
    assert [p["spec"]["ingress"] for p in objects["NetworkPolicy"]] == [[{}], [{}]]


def selector_labels(component: str) -> dict:
    return {"app.kubernetes.io/instance": "demo", "app.kubernetes.io/component": component}


# --- spec.storage.replaceLostAfterSeconds -------------------------------------------------


def _config(doc: dict, component: str = "server") -> dict[str, str]:
    maps = by_kind(desired_objects(parse(doc)))["ConfigMap"]
    return next(m for m in maps if m["metadata"]["name"].endswith(f"{component}-config"))["data"]


def test_replace_lost_after_is_off_by_default_and_sets_the_servers_setting():
    assert parse(resource()).storage.replace_lost_after == 0
    assert "WALTZ_SERVER_REPLACE_STORAGE_AFTER" not in _config(resource())
    doc = resource(storage={"replicas": 4, "replaceLostAfterSeconds": 600})
    assert parse(doc).storage.replace_lost_after == 600
    assert _config(doc)["WALTZ_SERVER_REPLACE_STORAGE_AFTER"] == "600"
    assert not any("REPLACE" in key for key in _config(doc, "storage"))
    # A value the server takes, as its own setting.
    from waltz_server.config import load_config

    plain = resource(storage={"replaceLostAfterSeconds": 600}, tls={"mode": "disabled"})
    assert load_config([], _config(plain)).replace_storage_after == 600.0


def test_changing_replace_lost_after_rolls_the_servers_not_the_storage_pods():
    def hashes(doc: dict) -> dict[str, str]:
        objects = by_kind(desired_objects(parse(doc)))
        return {
            kind: objects[kind][0]["spec"]["template"]["metadata"]["annotations"][
                "waltz.io/config-hash"
            ]
            for kind in ("StatefulSet", "Deployment")
        }

    off, on = hashes(resource()), hashes(resource(storage={"replaceLostAfterSeconds": 600}))
    assert off["Deployment"] != on["Deployment"]
    assert off["StatefulSet"] == on["StatefulSet"]
    later = hashes(resource(storage={"replaceLostAfterSeconds": 900}))
    assert later["Deployment"] != on["Deployment"]


def test_the_same_value_in_the_servers_settings_is_taken_once():
    doc = resource(
        storage={"replaceLostAfterSeconds": 600},
        server={"settings": {"replace_storage_after": "600.0"}},
    )
    assert _config(doc)["WALTZ_SERVER_REPLACE_STORAGE_AFTER"] == "600"


@pytest.mark.parametrize(
    ("storage", "settings", "message"),
    [
        (
            {"replaceLostAfterSeconds": -1},
            {},
            "spec.storage.replaceLostAfterSeconds must be 0 (off) or 1..2592000 seconds, got -1",
        ),
        (
            {"replaceLostAfterSeconds": 2592001},
            {},
            "spec.storage.replaceLostAfterSeconds must be 0 (off) or 1..2592000",
        ),
        (
            {"replaceLostAfterSeconds": "10m"},
            {},
            "spec.storage.replaceLostAfterSeconds must be an integer",
        ),
        (
            {"replaceLostAfterSeconds": True},
            {},
            "spec.storage.replaceLostAfterSeconds must be an integer",
        ),
        (
            {"replaceLostAfterSeconds": 600},
            {"replace_storage_after": "300"},
            "spec.server.settings.replace_storage_after ('300') differs from "
            "spec.storage.replaceLostAfterSeconds (600)",
        ),
        (
            {},
            {"REPLACE_STORAGE_AFTER": "300"},
            "spec.server.settings.REPLACE_STORAGE_AFTER ('300') differs from "
            "spec.storage.replaceLostAfterSeconds (0)",
        ),
        (
            {"replaceLostAfterSeconds": 600},
            {"replace_storage_after": "ten minutes"},
            "spec.server.settings.replace_storage_after ('ten minutes') differs",
        ),
    ],
    ids=["negative", "over-30-days", "string", "boolean", "conflict", "conflict-off", "garbage"],
)
def test_a_bad_replace_lost_after_is_refused_naming_the_fields(storage, settings, message):
    doc = resource(storage=storage, server={"settings": settings})
    with pytest.raises(SpecError) as info:
        parse(doc)
    assert message in str(info.value)


# --- spec.logFormat -----------------------------------------------------------------------


def test_log_format_is_text_by_default_and_leaves_the_configmaps_as_they_were():
    assert parse(resource()).log_format == "text"
    for component in ("storage", "server"):
        assert not any("LOG_FORMAT" in key for key in _config(resource(), component))
    # Text given: the same objects as without the field, so no pod rolls.
    assert desired_objects(parse(resource(logFormat="text"))) == desired_objects(parse(resource()))


def test_log_format_json_reaches_both_daemons_as_their_setting(tmp_path):
    doc = resource(logFormat="json", tls={"mode": "disabled"})
    assert parse(doc).log_format == "json"
    assert _config(doc, "storage")["WALTZ_STORAGE_LOG_FORMAT"] == "json"
    assert _config(doc, "server")["WALTZ_SERVER_LOG_FORMAT"] == "json"
    # Values each daemon takes, as its own setting.
    from waltz_server.config import load_config as load_server
    from waltz_storage.config import load_config as load_storage

    assert load_server([], _config(doc, "server")).log_format == "json"
    storage = {**_config(doc, "storage"), "WALTZ_STORAGE_DIRECTORY": str(tmp_path)}
    assert load_storage([], storage).log_format == "json"


def test_changing_log_format_rolls_both_tiers():
    def hashes(doc: dict) -> dict[str, str]:
        objects = by_kind(desired_objects(parse(doc)))
        return {
            kind: objects[kind][0]["spec"]["template"]["metadata"]["annotations"][
                "waltz.io/config-hash"
            ]
            for kind in ("StatefulSet", "Deployment")
        }

    text, json = hashes(resource()), hashes(resource(logFormat="json"))
    assert text["StatefulSet"] != json["StatefulSet"]
    assert text["Deployment"] != json["Deployment"]


def test_a_tiers_own_log_format_setting_wins_for_that_tier():
    doc = resource(logFormat="json", server={"settings": {"log_format": "text"}})
    assert _config(doc, "server")["WALTZ_SERVER_LOG_FORMAT"] == "text"
    assert _config(doc, "storage")["WALTZ_STORAGE_LOG_FORMAT"] == "json"
    doc = resource(storage={"settings": {"log_format": "json"}})
    assert _config(doc, "storage")["WALTZ_STORAGE_LOG_FORMAT"] == "json"
    assert "WALTZ_SERVER_LOG_FORMAT" not in _config(doc, "server")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("yaml", "spec.logFormat must be one of text, json, got 'yaml'"),
        ("JSON", "spec.logFormat must be one of text, json, got 'JSON'"),
        (True, "spec.logFormat must be str, got True"),
    ],
)
def test_a_bad_log_format_is_refused_naming_the_field(value, message):
    with pytest.raises(SpecError) as info:
        parse(resource(logFormat=value))
    assert message in str(info.value)
