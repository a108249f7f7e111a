"""The strict API server (strict_api/) enforces each rule of kube-apiserver the operator
relies on: every test here fails if its rule is dropped."""

from __future__ import annotations

import asyncio
import base64
import json
import pathlib
from typing import Any

import aiohttp
import kopf
import pytest
import pytest_asyncio
import yaml
from operator_harness import NS, WZ, load_crd
from strict_api import ADMIN_TOKEN, StrictApi, make_pki, strict_api, write_kubeconfig
from strict_api.selectors import matches_labels, parse_label_selector

from waltz_operator.kube import ApiError, KubeApi, connection_from_environment

ROOT = pathlib.Path(__file__).resolve().parents[2]

WIDGETS = yaml.safe_load(
    """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
spec:
  group: example.com
  scope: Namespaced
  names: {kind: Widget, listKind: WidgetList, plural: widgets, singular: widget}
  versions:
    - name: v1
      served: true
      storage: true
      subresources:
        status: {}
        scale: {specReplicasPath: .spec.replicas, statusReplicasPath: .status.replicas}
      schema:
        openAPIV3Schema:
          type: object
          required: [spec]
          properties:
            spec:
              type: object
              required: [size]
              x-kubernetes-validations:
                - rule: quantity(self.size).compareTo(quantity(oldSelf.size)) >= 0
                  message: size can never decrease
                  fieldPath: .size
                - rule: self.replicas % 2 == 1
                  messageExpression: "'replicas must be odd, not ' + string(self.replicas)"
                  fieldPath: .replicas
                  reason: FieldValueForbidden
              properties:
                replicas: {type: integer, minimum: 1, default: 3}
                size: {type: string, pattern: '^[0-9]+(Mi|Gi)$'}
                mode: {type: string, enum: [fast, safe], default: safe}
                class:
                  type: string
                  x-kubernetes-validations:
                    - {rule: self == oldSelf, message: class is immutable}
                tags:
                  type: array
                  maxItems: 2
                  x-kubernetes-list-type: set
                  items: {type: string}
                settings: {type: object, x-kubernetes-preserve-unknown-fields: true}
                ports:
                  type: array
                  x-kubernetes-list-type: map
                  x-kubernetes-list-map-keys: [name]
                  items:
                    type: object
                    required: [name]
                    properties:
                      name: {type: string}
                      port:
                        type: integer
                        x-kubernetes-validations:
                          - {rule: self >= oldSelf, message: a port may only grow}
            status:
              type: object
              properties:
                replicas: {type: integer}
                phase: {type: string}
"""
)
WIDGET_PATH = "/apis/example.com/v1/namespaces/default/widgets"
STS_PATH = f"/apis/apps/v1/namespaces/{NS}/statefulsets"
TOKEN = "tester-token"


def widget(name: str = "w", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"size": "1Gi", **spec},
    }


def statefulset(name: str = "demo-storage", **spec: Any) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "serviceName": name,
            "replicas": 3,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "storage", "image": "storage:1"}]},
            },
            "volumeClaimTemplates": [
                {
                    "metadata": {"name": "data"},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "10Gi"}},
                    },
                }
            ],
            **spec,
        },
    }


def pod(name: str, *, owner: dict | None = None, node: str | None = None, **meta: Any) -> dict:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, **meta},
        "spec": {"containers": [{"name": "c", "image": "busybox:1"}]},
    }
    if node:
        body["spec"]["nodeName"] = node
    if owner is not None:
        body["metadata"]["ownerReferences"] = [
            {
                "apiVersion": owner["apiVersion"],
                "kind": owner["kind"],
                "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"],
                "blockOwnerDeletion": True,
            }
        ]
    return body


def config_map(name: str, **fields: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NS},
        **fields,
    }


@pytest_asyncio.fixture
async def api():
    async with strict_api(
        crds=[WIDGETS, load_crd()], namespaces=("default", NS), tokens={TOKEN: "tester"}
    ) as server:
        yield server


async def wait_for(check, timeout: float = 10.0) -> Any:
    for _ in range(int(timeout / 0.05)):
        found = check()
        if found:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError("did not happen")


def message(response) -> str:
    return response.body["message"]


# --- discovery and kopf -------------------------------------------------------------------


@pytest.mark.asyncio
async def test_discovery_serves_resources_with_their_subresources(api: StrictApi):
    assert (await api.request("GET", "/version")).body["major"] == "1"
    assert "v1" in (await api.request("GET", "/api")).body["versions"]
    groups = {g["name"] for g in (await api.request("GET", "/apis")).body["groups"]}
    assert {"apps", "policy", "waltz.io", "example.com", "coordination.k8s.io"} <= groups
    core = {r["name"] for r in (await api.request("GET", "/api/v1")).body["resources"]}
    assert {"pods", "pods/status", "namespaces", "events", "persistentvolumeclaims"} <= core
    apps = {r["name"] for r in (await api.request("GET", "/apis/apps/v1")).body["resources"]}
    assert {"statefulsets/status", "statefulsets/scale", "deployments/scale"} <= apps
    waltz = (await api.request("GET", "/apis/waltz.io/v1alpha1")).body["resources"]
    assert {r["name"] for r in waltz} == {
        "waltzclusters",
        "waltzclusters/status",
        "waltzclusters/scale",
    }
    assert (await api.request("GET", "/apis/nothing.io/v1")).status == 404


@pytest.mark.asyncio
async def test_a_kopf_operator_in_namespaced_mode_sees_a_created_custom_resource(api):
    registry = kopf.OperatorRegistry()
    seen: list[str] = []

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=api.url, token=TOKEN, scheme="Bearer")

    @kopf.on.create("example.com", "v1", "widgets", registry=registry)
    def created(body: kopf.Body, **_: Any) -> None:
        seen.append(body["metadata"]["name"])
        kopf.info(body, reason="Seen", message="a widget")

    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(
        kopf.operator(
            registry=registry,
            standalone=True,
            namespaces=["default"],
            stop_flag=stop,
            ready_flag=ready,
        )
    )
    try:
        await asyncio.wait_for(ready.wait(), 30)
        response = await api.request("POST", WIDGET_PATH, widget("w1"))
        assert response.status == 201, response.body
        await wait_for(lambda: seen == ["w1"], 30)
        events = await wait_for(lambda: api.events("Seen"), 30)
        # kopf posts with generateName: the server named it
        assert events[0]["metadata"]["name"].startswith("kopf-event-")
        assert events[0]["involvedObject"]["name"] == "w1"
        # its bookkeeping went through JSON patches (the finalizer, annotations) as tester
        patched = [r for r in api.requests if r.method == "PATCH" and r.user == "tester"]
        assert patched and all(r.status == 200 for r in patched)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


# --- authentication -----------------------------------------------------------------------


@pytest.mark.asyncio
async def test_anonymous_and_unknown_tokens_get_401_and_tokens_can_be_revoked(api):
    for token in (None, "wrong"):
        response = await api.request("GET", "/api/v1/namespaces", token=token)
        assert response.status == 401
        assert (response.body["reason"], response.body["code"]) == ("Unauthorized", 401)
    assert (await api.request("GET", "/api/v1/namespaces", token=TOKEN)).status == 200
    assert api.requests[-1].user == "tester"
    del api.tokens[TOKEN]  # rotated away
    assert (await api.request("GET", "/api/v1/namespaces", token=TOKEN)).status == 401
    assert (await api.request("GET", "/healthz", token=None)).status == 200


@pytest.mark.asyncio
async def test_a_client_certificate_of_the_ca_authenticates_as_its_cn(tmp_path, strict_pki):
    pki = strict_pki
    async with strict_api(pki=pki, tokens={TOKEN: "tester"}) as api:
        assert api.url.startswith("https://")
        assert (await api.request("GET", "/api/v1/namespaces", token=None)).status == 401
        # The operator's own client, from kubeconfigs written by the helper:
        client = pki.client("waltz-operator", groups=("system:masters",))
        for path, user in (
            (
                write_kubeconfig(
                    str(tmp_path / "cert"), api.url, client=client, ca_file=pki.ca.cert
                ),
                "waltz-operator",
            ),
            (
                write_kubeconfig(
                    str(tmp_path / "token"), api.url, token=TOKEN, ca_file=pki.ca.cert
                ),
                "tester",
            ),
        ):
            kube = KubeApi(connection_from_environment(path))
            try:
                assert await kube.get("Secret", "default", "nothing") is None  # 404: in
            finally:
                await kube.close()
            assert (api.requests[-1].user, api.requests[-1].status) == (user, 404)
        stranger = make_pki(str(tmp_path / "other")).client("mallory")
        path = write_kubeconfig(
            str(tmp_path / "bad"), api.url, client=stranger, ca_file=pki.ca.cert
        )
        kube = KubeApi(connection_from_environment(path))
        try:
            with pytest.raises((ApiError, aiohttp.ClientError)):
                await kube.get("Secret", "default", "nothing")
        finally:
            await kube.close()


# --- built-in kinds -----------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_statefulset_update_may_change_only_the_mutable_fields(api):
    created = await api.request("POST", STS_PATH, statefulset())
    assert created.status == 201, created.body
    forbidden = (
        'StatefulSet.apps "demo-storage" is invalid: spec: Forbidden: updates to statefulset '
        "spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', "
        "'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden"
    )
    bigger = statefulset()["spec"]["volumeClaimTemplates"]
    bigger[0]["spec"]["resources"]["requests"]["storage"] = "20Gi"
    for change in (
        {"serviceName": "other"},
        {"podManagementPolicy": "OrderedReady"},
        {"volumeClaimTemplates": bigger},
        {"selector": {"matchLabels": {"app": "demo-storage", "x": "y"}}},
    ):
        response = await api.request("PUT", f"{STS_PATH}/demo-storage", statefulset(**change))
        assert response.status == 422, change
        assert message(response) == forbidden or "selector" in change
    allowed = statefulset(replicas=5, updateStrategy={"type": "OnDelete"})
    allowed["spec"]["template"]["spec"]["containers"][0]["image"] = "storage:2"
    response = await api.request("PUT", f"{STS_PATH}/demo-storage", allowed)
    assert response.status == 200, response.body
    assert response.body["metadata"]["generation"] == 2
    mismatched = statefulset("other")
    mismatched["spec"]["template"]["metadata"]["labels"] = {"app": "else"}
    response = await api.request("POST", STS_PATH, mismatched)
    assert "`selector` does not match template `labels`" in message(response)


@pytest.mark.asyncio
async def test_a_deployment_selector_is_immutable(api):
    path = f"/apis/apps/v1/namespaces/{NS}/deployments"
    body = statefulset("server")
    body.update(kind="Deployment")
    for key in ("serviceName", "podManagementPolicy", "volumeClaimTemplates"):
        body["spec"].pop(key)
    assert (await api.request("POST", path, body)).status == 201
    body["spec"]["selector"]["matchLabels"]["tier"] = "x"
    body["spec"]["template"]["metadata"]["labels"]["tier"] = "x"
    response = await api.request("PUT", f"{path}/server", body)
    assert response.status == 422
    assert 'spec.selector: Invalid value: "object": field is immutable' in message(response)


def claim(size: str, storage_class: str = "fast") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data-demo-storage-0", "namespace": NS},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": storage_class,
            "resources": {"requests": {"storage": size}},
        },
        "status": {"phase": "Bound", "capacity": {"storage": size}},
    }


@pytest.mark.asyncio
async def test_a_claim_grows_only_where_its_class_allows_and_never_shrinks(api):
    path = f"/api/v1/namespaces/{NS}/persistentvolumeclaims/data-demo-storage-0"
    api.put(claim("10Gi"))
    response = await api.request("PUT", path, claim("9Gi"))
    assert response.status == 422
    assert message(response) == (
        'PersistentVolumeClaim "data-demo-storage-0" is invalid: '
        "spec.resources.requests.storage: Forbidden: field can not be less than previous value"
    )
    response = await api.request("PUT", path, claim("10Gi", "slow"))
    assert response.status == 422
    assert "spec: Forbidden: spec is immutable after creation" in message(response)
    assert (await api.request("PUT", path, claim("20Gi"))).status == 200
    api.expandable = lambda storage_class: storage_class != "fast"
    response = await api.request("PUT", path, claim("30Gi"))
    assert (response.status, response.body["reason"]) == (403, "Forbidden")
    assert "storageclass that provisions the pvc must support resize" in message(response)


@pytest.mark.asyncio
async def test_a_service_gets_a_cluster_ip_that_never_changes(api):
    path = f"/api/v1/namespaces/{NS}/services"
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "demo"},
        "spec": {"selector": {"app": "x"}, "ports": [{"port": 80}]},
    }
    created = await api.request("POST", path, service)
    ip = created.body["spec"]["clusterIP"]
    assert ip.startswith("10.") and created.body["spec"]["ports"][0]["protocol"] == "TCP"
    kept = await api.request("PUT", f"{path}/demo", service)  # leaves it out: kept
    assert kept.body["spec"]["clusterIP"] == ip
    service["spec"]["clusterIP"] = "None"
    response = await api.request("PUT", f"{path}/demo", service)
    assert response.status == 422 and "spec.clusterIPs[0]" in message(response)
    too_long = {**service, "metadata": {"name": "a" * 64}}
    response = await api.request("POST", path, too_long)
    assert "metadata.name: Invalid value" in message(response)
    assert "must be no more than 63 characters" in message(response)
    starts_with_digit = {**service, "metadata": {"name": "1demo"}}
    assert "DNS-1035 label" in message(await api.request("POST", path, starts_with_digit))


@pytest.mark.asyncio
async def test_a_pod_spec_is_immutable_but_for_images(api):
    path = f"/api/v1/namespaces/{NS}/pods"
    assert (await api.request("POST", path, pod("p"))).status == 201
    changed = pod("p")
    changed["spec"]["containers"][0]["image"] = "busybox:2"
    assert (await api.request("PUT", f"{path}/p", changed)).status == 200
    changed["spec"]["containers"][0]["command"] = ["sh"]
    response = await api.request("PUT", f"{path}/p", changed)
    assert response.status == 422
    assert "spec: Forbidden: pod updates may not change fields other than" in message(response)
    no_image = pod("q")
    del no_image["spec"]["containers"][0]["image"]
    response = await api.request("POST", path, no_image)
    assert "spec.containers[0].image: Required value" in message(response)


@pytest.mark.asyncio
async def test_immutable_config_maps_refuse_data_changes(api):
    path = f"/api/v1/namespaces/{NS}/configmaps"
    assert (
        await api.request("POST", path, config_map("c", data={"a": "1"}, immutable=True))
    ).status == 201
    response = await api.request(
        "PUT", f"{path}/c", config_map("c", data={"a": "2"}, immutable=True)
    )
    assert response.status == 422
    assert "data: Forbidden: field is immutable when `immutable` is set" in message(response)
    bad_key = await api.request("POST", path, config_map("d", data={"a b": "1"}))
    assert "a valid config key must consist of alphanumeric characters" in message(bad_key)


@pytest.mark.asyncio
async def test_labels_and_owner_references_are_validated_on_every_kind(api):
    response = await api.request(
        "POST",
        f"/api/v1/namespaces/{NS}/configmaps",
        config_map("c", metadata={"name": "c", "labels": {"instance": "x" * 64}}),
    )
    assert response.status == 422
    assert "metadata.labels: Invalid value" in message(response)
    assert "must be no more than 63 characters" in message(response)
    # A name too long for a derived object: the StatefulSet's pods are <name>-<ordinal>.
    response = await api.request("POST", STS_PATH, statefulset("s" * 64))
    assert response.status == 422 and "must be no more than 63 characters" in message(response)


# --- custom resources: schema, defaults, CEL ----------------------------------------------


@pytest.mark.asyncio
async def test_a_custom_resource_is_checked_against_its_schema(api):
    cases = [
        (
            {"replicas": "3"},
            'spec.replicas: Invalid value: "string": '
            'spec.replicas in body must be of type integer: "string"',
        ),
        (
            {"replicas": 0},
            "spec.replicas: Invalid value: 0: "
            "spec.replicas in body should be greater than or equal to 1",
        ),
        (
            {"mode": "slow"},
            'spec.mode: Unsupported value: "slow": supported values: "fast", "safe"',
        ),
        ({"size": "ten"}, 'spec.size: Invalid value: "ten": spec.size in body should match'),
        ({"tags": ["a", "b", "c"]}, "spec.tags: Too many: 3: must have at most 2 items"),
        ({"tags": ["a", "a"]}, 'spec.tags[1]: Duplicate value: "a"'),
        ({"ports": [{"port": 1}]}, "spec.ports[0].name: Required value"),
    ]
    for spec, expected in cases:
        response = await api.request("POST", WIDGET_PATH, widget(**spec))
        assert response.status == 422, spec
        assert expected in message(response), message(response)
        assert message(response).startswith('Widget.example.com "w" is invalid: ')
    missing = widget()
    del missing["spec"]["size"]
    assert "spec.size: Required value" in message(await api.request("POST", WIDGET_PATH, missing))


@pytest.mark.asyncio
async def test_unknown_fields_are_pruned_with_a_warning_or_refused_when_strict(api):
    body = widget(colour="red", settings={"anything": {"goes": 1}})
    response = await api.request("POST", WIDGET_PATH, body)
    assert response.status == 201
    assert "colour" not in response.body["spec"]
    assert response.body["spec"]["settings"] == {"anything": {"goes": 1}}  # preserved
    assert 'unknown field \\"spec.colour\\"' in response.headers["Warning"]
    strict = await api.request(
        "POST", WIDGET_PATH, widget("w2", colour="red"), query={"fieldValidation": "Strict"}
    )
    assert strict.status == 400 and 'unknown field "spec.colour"' in message(strict)


@pytest.mark.asyncio
async def test_schema_defaults_are_applied_on_create_and_update(api):
    created = await api.request("POST", WIDGET_PATH, widget())
    assert (created.body["spec"]["replicas"], created.body["spec"]["mode"]) == (3, "safe")
    body = created.body
    del body["spec"]["mode"]  # an update that leaves it out gets the default again
    updated = await api.request("PUT", f"{WIDGET_PATH}/w", body)
    assert updated.status == 200 and updated.body["spec"]["mode"] == "safe"
    # the real CRD: the example with nothing but the ZooKeeper gets every default
    example = yaml.safe_load((ROOT / "examples" / "waltzcluster-minimal.yaml").read_text())
    example["metadata"]["namespace"] = NS
    stored = api.put(example)
    assert stored["spec"]["image"]["pullPolicy"] == "IfNotPresent"
    assert stored["spec"]["storage"]["replicas"] >= stored["spec"]["replicasPerPartition"]


@pytest.mark.asyncio
async def test_cel_rules_refuse_with_their_message_reason_and_field_path(api):
    response = await api.request("POST", WIDGET_PATH, widget(replicas=4))
    assert response.status == 422
    assert message(response) == (
        'Widget.example.com "w" is invalid: spec.replicas: Forbidden: replicas must be odd, not 4'
    )
    assert response.body["details"]["causes"] == [
        {
            "reason": "FieldValueForbidden",
            "message": "Forbidden: replicas must be odd, not 4",
            "field": "spec.replicas",
        }
    ]
    # the real CRD's rule, with its own message
    doc = load_crd()
    rules = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "x-kubernetes-validations"
    ]
    odd = next(r for r in rules if "% 2" in r["rule"])
    cluster = {
        "apiVersion": "waltz.io/v1alpha1",
        "kind": "WaltzCluster",
        "metadata": {"name": "demo", "namespace": NS},
        "spec": {"replicasPerPartition": 2, "zookeeper": {"connect": "zk:2181"}},
    }
    response = await api.request(
        "POST", f"/apis/waltz.io/v1alpha1/namespaces/{NS}/waltzclusters", cluster
    )
    assert response.status == 422 and odd["message"] in message(response)


@pytest.mark.asyncio
async def test_transition_rules_run_on_updates_where_the_old_value_exists(api):
    created = await api.request(
        "POST", WIDGET_PATH, widget(size="2Gi", ports=[{"name": "a", "port": 80}])
    )
    assert created.status == 201  # on create, no rule with oldSelf runs
    body = created.body

    async def update(**spec: Any):
        changed = json.loads(json.dumps(body))
        changed["spec"].update(spec)
        return await api.request("PUT", f"{WIDGET_PATH}/w", changed)

    response = await update(size="1024Mi")
    assert response.status == 422
    assert 'spec.size: Invalid value: "object": size can never decrease' in message(response)
    assert (await update(size="3Gi")).status == 200
    body = (await api.request("GET", f"{WIDGET_PATH}/w")).body
    assert (await update(**{"class": "gold"})).status == 200  # no old value: not checked
    body = (await api.request("GET", f"{WIDGET_PATH}/w")).body
    response = await update(**{"class": "silver"})
    assert 'spec.class: Invalid value: "string": class is immutable' in message(response)
    response = await update(ports=[{"name": "a", "port": 79}])  # the item "a", correlated
    assert 'spec.ports[0].port: Invalid value: "integer": a port may only grow' in message(response)
    assert (await update(ports=[{"name": "b", "port": 1}])).status == 200  # a new item


# --- bookkeeping: generation, status, concurrency -----------------------------------------


@pytest.mark.asyncio
async def test_generation_counts_spec_changes_only(api):
    created = (await api.request("POST", WIDGET_PATH, widget())).body
    meta = created["metadata"]
    assert meta["generation"] == 1 and meta["uid"] and meta["creationTimestamp"]
    rv = int(meta["resourceVersion"])
    labelled = await api.request(
        "PATCH",
        f"{WIDGET_PATH}/w",
        {"metadata": {"labels": {"a": "b"}}},
        content_type="application/merge-patch+json",
    )
    assert labelled.body["metadata"]["generation"] == 1
    assert int(labelled.body["metadata"]["resourceVersion"]) > rv
    status = await api.request(
        "PATCH",
        f"{WIDGET_PATH}/w/status",
        {"status": {"phase": "Up"}},
        content_type="application/merge-patch+json",
    )
    assert status.body["metadata"]["generation"] == 1
    spec = await api.request(
        "PATCH",
        f"{WIDGET_PATH}/w",
        {"spec": {"replicas": 5}},
        content_type="application/merge-patch+json",
    )
    assert spec.body["metadata"]["generation"] == 2
    same = await api.request("PUT", f"{WIDGET_PATH}/w", spec.body)
    assert same.body["metadata"]["resourceVersion"] == spec.body["metadata"]["resourceVersion"]


@pytest.mark.asyncio
async def test_the_status_subresource_is_isolated_from_the_object(api):
    body = widget()
    body["status"] = {"phase": "Forged"}
    created = (await api.request("POST", WIDGET_PATH, body)).body
    assert "status" not in created  # status is not the creator's to set
    created["status"] = {"phase": "Forged"}
    created["spec"]["replicas"] = 5
    updated = (await api.request("PUT", f"{WIDGET_PATH}/w", created)).body
    assert "status" not in updated and updated["spec"]["replicas"] == 5
    updated["status"] = {"phase": "Up"}
    updated["spec"]["replicas"] = 7
    through_status = (await api.request("PUT", f"{WIDGET_PATH}/w/status", updated)).body
    assert through_status["status"] == {"phase": "Up"}
    assert through_status["spec"]["replicas"] == 5


@pytest.mark.asyncio
async def test_a_stale_resource_version_is_a_conflict(api):
    created = (await api.request("POST", WIDGET_PATH, widget())).body
    fresh = await api.request(
        "PATCH",
        f"{WIDGET_PATH}/w",
        {"spec": {"replicas": 5}},
        content_type="application/merge-patch+json",
    )
    assert fresh.status == 200
    created["spec"]["replicas"] = 7
    stale = await api.request("PUT", f"{WIDGET_PATH}/w", created)
    assert (stale.status, stale.body["reason"]) == (409, "Conflict")
    assert message(stale) == (
        'Operation cannot be fulfilled on widgets.example.com "w": the object has been modified; '
        "please apply your changes to the latest version and try again"
    )
    stale_patch = await api.request(
        "PATCH",
        f"{WIDGET_PATH}/w",
        {
            "metadata": {"resourceVersion": created["metadata"]["resourceVersion"]},
            "spec": {"replicas": 9},
        },
        content_type="application/merge-patch+json",
    )
    assert stale_patch.status == 409
    guarded = await api.request(
        "PATCH",
        f"{WIDGET_PATH}/w",
        [
            {
                "op": "test",
                "path": "/metadata/resourceVersion",
                "value": created["metadata"]["resourceVersion"],
            },
            {"op": "add", "path": "/metadata/finalizers", "value": ["x.io/f"]},
        ],
        content_type="application/json-patch+json",
    )
    assert guarded.status == 422  # kopf's guarded finalizer patch
    unconditional = {k: v for k, v in created.items()}
    unconditional["metadata"] = {"name": "w", "namespace": "default"}
    response = await api.request("PUT", f"{WIDGET_PATH}/w", unconditional)
    assert response.status == 422 and "must be specified for an update" in message(response)
    again = await api.request("POST", WIDGET_PATH, widget())
    assert (again.status, again.body["reason"]) == (409, "AlreadyExists")
    assert message(again) == 'widgets.example.com "w" already exists'


@pytest.mark.asyncio
async def test_patch_formats(api):
    path = f"{STS_PATH}/demo-storage"
    assert (await api.request("POST", STS_PATH, statefulset())).status == 201
    strategic = await api.request(
        "PATCH",
        path,
        {"spec": {"template": {"spec": {"containers": [{"name": "sidecar", "image": "s:1"}]}}}},
        content_type="application/strategic-merge-patch+json",
    )
    names = [c["name"] for c in strategic.body["spec"]["template"]["spec"]["containers"]]
    assert names == ["storage", "sidecar"]  # merged by name, not replaced
    merge = await api.request(
        "PATCH",
        path,
        {"spec": {"template": {"spec": {"containers": [{"name": "only", "image": "o:1"}]}}}},
        content_type="application/merge-patch+json",
    )
    assert [c["name"] for c in merge.body["spec"]["template"]["spec"]["containers"]] == ["only"]
    custom = await api.request(
        "PATCH", f"{WIDGET_PATH}/w", {}, content_type="application/strategic-merge-patch+json"
    )
    assert custom.status == 415  # custom resources take no strategic merge patch


# --- server-side apply --------------------------------------------------------------------


async def apply(api, body, manager: str, force: bool = False):
    return await api.request(
        "PATCH",
        f"{STS_PATH}/{body['metadata']['name']}",
        yaml.safe_dump(body),
        content_type="application/apply-patch+yaml",
        query={"fieldManager": manager, **({"force": "true"} if force else {})},
    )


@pytest.mark.asyncio
async def test_server_side_apply_tracks_owners_and_refuses_to_take_their_fields(api):
    body = statefulset()
    body["metadata"]["labels"] = {"team": "a", "tier": "storage"}
    created = await apply(api, body, "waltz-operator")
    assert created.status == 201  # apply creates a missing object
    rv = created.body["metadata"]["resourceVersion"]
    again = await apply(api, body, "waltz-operator")
    assert again.status == 200
    assert again.body["metadata"]["resourceVersion"] == rv  # a no-op apply writes nothing
    assert again.body["metadata"]["generation"] == 1
    # someone else changes replicas with an update: now theirs
    scaled = await api.request(
        "PATCH",
        f"{STS_PATH}/demo-storage",
        {"spec": {"replicas": 5}},
        content_type="application/merge-patch+json",
        query={"fieldManager": "kubectl-edit"},
    )
    assert scaled.status == 200
    refused = await apply(api, body, "waltz-operator")
    assert (refused.status, refused.body["reason"]) == (409, "Conflict")
    assert message(refused) == (
        'Apply failed with 1 conflict: conflict with "kubectl-edit" using apps/v1: .spec.replicas'
    )
    assert refused.body["details"]["causes"][0]["field"] == ".spec.replicas"
    forced = await apply(api, body, "waltz-operator", force=True)
    assert forced.status == 200 and forced.body["spec"]["replicas"] == 3
    owners = {m["manager"]: m for m in forced.body["metadata"]["managedFields"]}
    assert "f:replicas" in owners["waltz-operator"]["fieldsV1"]["f:spec"]
    assert "kubectl-edit" not in owners  # it owned nothing else
    # a field the applier owned and now leaves out goes; another manager's stays
    await api.request(
        "PATCH",
        f"{STS_PATH}/demo-storage",
        {"metadata": {"labels": {"owner": "me"}}},
        content_type="application/merge-patch+json",
        query={"fieldManager": "someone"},
    )
    body["metadata"]["labels"] = {"team": "a"}
    pruned = await apply(api, body, "waltz-operator")
    assert pruned.body["metadata"]["labels"] == {"team": "a", "owner": "me"}
    without_manager = await api.request(
        "PATCH",
        f"{STS_PATH}/demo-storage",
        yaml.safe_dump(body),
        content_type="application/apply-patch+yaml",
    )
    assert without_manager.status == 400
    assert "fieldManager is required for apply requests" in message(without_manager)


@pytest.mark.asyncio
async def test_apply_merges_containers_and_ports_by_their_keys(api):
    body = statefulset()
    containers = body["spec"]["template"]["spec"]["containers"]
    containers[0]["ports"] = [{"containerPort": 80}, {"containerPort": 81}]
    assert (await apply(api, body, "a")).status == 201
    sidecar = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "demo-storage", "namespace": NS},
        "spec": {
            "template": {"spec": {"containers": [{"name": "sidecar", "image": "s:1"}]}},
        },
    }
    both = await apply(api, sidecar, "b")
    assert both.status == 200, both.body
    template = both.body["spec"]["template"]["spec"]
    assert [c["name"] for c in template["containers"]] == ["storage", "sidecar"]
    fields = {m["manager"]: m["fieldsV1"] for m in both.body["metadata"]["managedFields"]}
    ports = fields["a"]["f:spec"]["f:template"]["f:spec"]["f:containers"]['k:{"name":"storage"}']
    assert 'k:{"containerPort":80,"protocol":"TCP"}' in ports["f:ports"]
    containers[0]["ports"] = [{"containerPort": 80}]  # a drops port 81
    dropped = await apply(api, body, "a")
    storage = dropped.body["spec"]["template"]["spec"]["containers"][0]
    assert [p["containerPort"] for p in storage["ports"]] == [80]


# --- selectors ----------------------------------------------------------------------------


def test_label_selector_semantics():
    labels = {"app": "waltz", "tier": "storage", "zone": "a"}
    cases = {
        "app=waltz": True,
        "app==waltz,tier=storage": True,
        "app!=waltz": False,
        "missing!=x": True,
        "tier in (storage,server)": True,
        "tier notin (storage)": False,
        "missing notin (x)": True,
        "zone": True,
        "!zone": False,
        "!missing": True,
        "app=waltz,tier=server": False,
        "": True,
    }
    for selector, expected in cases.items():
        assert matches_labels(parse_label_selector(selector), labels) is expected, selector


@pytest.mark.asyncio
async def test_selectors_filter_lists_and_bad_syntax_is_a_400(api):
    for name, tier in (("a", "storage"), ("b", "server"), ("c", None)):
        labels = {"app": "waltz", **({"tier": tier} if tier else {})}
        api.put(config_map(name, metadata={"name": name, "namespace": NS, "labels": labels}))
    path = f"/api/v1/namespaces/{NS}/configmaps"

    async def names(**query: str) -> list[str]:
        response = await api.request("GET", path, query=query)
        assert response.status == 200, response.body
        return [i["metadata"]["name"] for i in response.body["items"]]

    assert await names(labelSelector="tier in (storage, server)") == ["a", "b"]
    assert await names(labelSelector="tier!=storage") == ["b", "c"]
    assert await names(labelSelector="app,!tier") == ["c"]
    assert await names(fieldSelector="metadata.name=b") == ["b"]
    assert await names(fieldSelector="metadata.name!=b,metadata.namespace=prod") == ["a", "c"]
    for bad in ("tier in storage", "a=b=c", "tier in (x", "=x"):
        response = await api.request("GET", path, query={"labelSelector": bad})
        assert (response.status, response.body["reason"]) == (400, "BadRequest"), bad
    response = await api.request("GET", path, query={"fieldSelector": "data.a=1"})
    assert response.status == 400 and "field label not supported" in message(response)
    first = await api.request("GET", path, query={"limit": "2"})
    assert len(first.body["items"]) == 2 and first.body["metadata"]["continue"]
    rest = await api.request(
        "GET", path, query={"limit": "2", "continue": first.body["metadata"]["continue"]}
    )
    assert [i["metadata"]["name"] for i in rest.body["items"]] == ["c"]


# --- deletion, finalizers, garbage collection ---------------------------------------------


@pytest.mark.asyncio
async def test_finalizers_hold_a_deletion_and_none_may_be_added_meanwhile(api):
    path = f"/api/v1/namespaces/{NS}/configmaps"
    api.put(
        config_map("held", metadata={"name": "held", "namespace": NS, "finalizers": ["x.io/f"]})
    )
    deleted = await api.request("DELETE", f"{path}/held")
    assert deleted.status == 200
    meta = deleted.body["metadata"]
    assert meta["deletionTimestamp"] and meta["deletionGracePeriodSeconds"] == 0
    body = deleted.body
    body["metadata"]["finalizers"] = ["x.io/f", "y.io/g"]
    refused = await api.request("PUT", f"{path}/held", body)
    assert refused.status == 422
    assert "metadata.finalizers: Forbidden: no new finalizers can be added" in message(refused)
    body["metadata"]["finalizers"] = []
    assert (await api.request("PUT", f"{path}/held", body)).status == 200
    assert api.get("v1/configmaps", NS, "held") is None  # the last finalizer gone: so is it
    gone = await api.request("DELETE", f"{path}/held")
    assert gone.status == 404
    stale = config_map("pre")
    api.put(stale)
    response = await api.request("DELETE", f"{path}/pre", {"preconditions": {"uid": "not-its-uid"}})
    assert response.status == 409 and "Precondition failed: UID in precondition" in message(
        response
    )


def owner_and_dependents(api) -> tuple[dict, dict, dict]:
    owner = api.put(config_map("owner"))
    plain = api.put(
        {
            **config_map("dependent"),
            "metadata": {
                "name": "dependent",
                "namespace": NS,
                "ownerReferences": pod("x", owner=owner)["metadata"]["ownerReferences"],
            },
        }
    )
    on_node = api.put(pod("worker", owner=owner, node="node-1"))
    return owner, plain, on_node


@pytest.mark.asyncio
async def test_background_deletion_deletes_the_owner_then_its_dependents(api):
    owner_and_dependents(api)
    response = await api.request(
        "DELETE", f"/api/v1/namespaces/{NS}/configmaps/owner", {"propagationPolicy": "Background"}
    )
    assert response.body["status"] == "Success"
    assert api.get("v1/configmaps", NS, "owner") is None
    await wait_for(lambda: api.get("v1/configmaps", NS, "dependent") is None)
    # a pod on a node is deleted gracefully: Terminating until its kubelet confirms
    worker = await wait_for(
        lambda: (
            (p := api.get("v1/pods", NS, "worker")) and p["metadata"].get("deletionTimestamp") and p
        )
    )
    assert worker["metadata"]["deletionGracePeriodSeconds"] == 30
    assert api.remove("v1/pods", NS, "worker", grace=0)


@pytest.mark.asyncio
async def test_foreground_deletion_waits_for_blocking_dependents(api):
    owner_and_dependents(api)
    response = await api.request(
        "DELETE", f"/api/v1/namespaces/{NS}/configmaps/owner", {"propagationPolicy": "Foreground"}
    )
    assert "foregroundDeletion" in response.body["metadata"]["finalizers"]
    await wait_for(lambda: api.get("v1/configmaps", NS, "dependent") is None)
    await wait_for(lambda: api.get("v1/pods", NS, "worker")["metadata"].get("deletionTimestamp"))
    await asyncio.sleep(0.3)
    assert api.get("v1/configmaps", NS, "owner") is not None  # the terminating pod blocks it
    api.remove("v1/pods", NS, "worker", grace=0)  # the kubelet confirms
    await wait_for(lambda: api.get("v1/configmaps", NS, "owner") is None)


@pytest.mark.asyncio
async def test_orphan_deletion_leaves_the_dependents_without_the_owner(api):
    owner_and_dependents(api)
    response = await api.request(
        "DELETE", f"/api/v1/namespaces/{NS}/configmaps/owner", {"propagationPolicy": "Orphan"}
    )
    assert "orphan" in response.body["metadata"]["finalizers"]
    await wait_for(lambda: api.get("v1/configmaps", NS, "owner") is None)
    await api.gc_idle()
    dependent = api.get("v1/configmaps", NS, "dependent")
    assert dependent is not None and "ownerReferences" not in dependent["metadata"]
    assert api.get("v1/pods", NS, "worker")["metadata"].get("deletionTimestamp") is None


@pytest.mark.asyncio
async def test_an_owner_in_another_namespace_counts_as_absent(api):
    """kube-controller-manager looks a namespaced owner up in the dependent's namespace:
    an owner elsewhere is absent, and the dependent is collected (OwnerRefInvalidNamespace)."""
    elsewhere = api.put(
        {**config_map("owner"), "metadata": {"name": "owner", "namespace": "default"}}
    )
    refs = pod("x", owner=elsewhere)["metadata"]["ownerReferences"]
    api.put(
        {**config_map("d"), "metadata": {"name": "d", "namespace": NS, "ownerReferences": refs}}
    )
    await wait_for(lambda: api.get("v1/configmaps", NS, "d") is None)
    assert api.get("v1/configmaps", "default", "owner") is not None
    # with one owner left, only the reference to the absent one goes
    here = api.put(config_map("here"))
    both = refs + pod("x", owner=here)["metadata"]["ownerReferences"]
    api.put(
        {**config_map("e"), "metadata": {"name": "e", "namespace": NS, "ownerReferences": both}}
    )
    await wait_for(
        lambda: len(api.get("v1/configmaps", NS, "e")["metadata"]["ownerReferences"]) == 1
    )


@pytest.mark.asyncio
async def test_objects_need_an_existing_namespace_which_takes_its_objects_along(api):
    elsewhere = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}
    response = await api.request("POST", "/api/v1/namespaces/nowhere/configmaps", elsewhere)
    assert response.status == 404 and message(response) == 'namespaces "nowhere" not found'
    api.put(config_map("c", metadata={"name": "c", "namespace": NS, "finalizers": ["x.io/f"]}))
    deleted = await api.request("DELETE", f"/api/v1/namespaces/{NS}")
    assert deleted.body["status"]["phase"] == "Terminating"
    refused = await api.request("POST", f"/api/v1/namespaces/{NS}/configmaps", config_map("d"))
    assert refused.status == 403 and "because it is being terminated" in message(refused)
    held = await wait_for(lambda: api.get("v1/configmaps", NS, "c"))
    assert held["metadata"]["deletionTimestamp"]  # emptied: its objects are being deleted
    api.patch("v1/configmaps", NS, "c", {"metadata": {"finalizers": None}})
    await wait_for(lambda: api.get("v1/namespaces", None, NS) is None)
    assert api.get("v1/configmaps", NS, "c") is None


# --- watch --------------------------------------------------------------------------------


async def watch_events(api, path: str, query: dict[str, str], count: int) -> list[dict]:
    events: list[dict] = []
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            api.url + path,
            params={"watch": "true", **query},
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        ) as response,
    ):
        assert response.status == 200
        async for line in response.content:
            events.append(json.loads(line))
            if len(events) >= count:
                break
    return events


@pytest.mark.asyncio
async def test_a_watch_replays_from_a_resource_version_and_forgets_old_ones(api):
    path = f"/api/v1/namespaces/{NS}/configmaps"
    api.put(config_map("before"))
    listed = (await api.request("GET", path)).body["metadata"]["resourceVersion"]
    api.put(config_map("a", metadata={"name": "a", "namespace": NS, "labels": {"pick": "yes"}}))
    api.put(config_map("a", metadata={"name": "a", "namespace": NS, "labels": {"pick": "no"}}))
    api.remove("v1/configmaps", NS, "a")
    events = await watch_events(api, path, {"resourceVersion": listed}, 3)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "a"),
        ("MODIFIED", "a"),
        ("DELETED", "a"),
    ]
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == sorted(rvs) and rvs[0] > int(listed)
    # selected by a label: leaving the selection is a DELETED
    picked = await watch_events(
        api, path, {"resourceVersion": listed, "labelSelector": "pick=yes"}, 2
    )
    assert [e["type"] for e in picked] == ["ADDED", "DELETED"]
    # no resourceVersion: the current objects first
    current = await watch_events(api, path, {}, 1)
    assert current[0]["type"] == "ADDED" and current[0]["object"]["metadata"]["name"] == "before"
    # initial events streamed, then a bookmark marks their end
    initial = await watch_events(
        api,
        path,
        {
            "sendInitialEvents": "true",
            "allowWatchBookmarks": "true",
            "resourceVersionMatch": "NotOlderThan",
        },
        2,
    )
    assert [e["type"] for e in initial] == ["ADDED", "BOOKMARK"]
    annotations = initial[1]["object"]["metadata"]["annotations"]
    assert annotations == {"k8s.io/initial-events-end": "true"}
    api.store.compact()
    expired = await watch_events(api, path, {"resourceVersion": listed}, 1)
    assert expired[0]["type"] == "ERROR" and expired[0]["object"]["code"] == 410
    assert expired[0]["object"]["reason"] == "Expired"


@pytest.mark.asyncio
async def test_a_watch_sends_bookmarks_and_ends_after_its_timeout():
    async with strict_api(namespaces=(NS,), bookmark_interval=0.2) as api:
        path = f"/api/v1/namespaces/{NS}/configmaps"
        listed = (await api.request("GET", path)).body["metadata"]["resourceVersion"]
        events = await watch_events(
            api, path, {"resourceVersion": listed, "allowWatchBookmarks": "true"}, 1
        )
        assert events[0]["type"] == "BOOKMARK"
        assert events[0]["object"]["metadata"]["resourceVersion"] == listed
        started = asyncio.get_running_loop().time()
        assert (
            await watch_events(api, path, {"resourceVersion": listed, "timeoutSeconds": "1"}, 99)
            == []
        )
        assert asyncio.get_running_loop().time() - started < 5


# --- the request log ----------------------------------------------------------------------


@pytest.mark.asyncio
async def test_the_request_log_counts_requests_with_their_users_and_bodies(api):
    await api.request("POST", f"/api/v1/namespaces/{NS}/configmaps", config_map("c"), token=TOKEN)
    record = api.requests[-1]
    assert (record.method, record.path, record.user, record.status) == (
        "POST",
        f"/api/v1/namespaces/{NS}/configmaps",
        "tester",
        201,
    )
    assert record.body["metadata"]["name"] == "c"
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "s", "namespace": NS},
        "data": {"k": "not base64!"},
    }
    response = await api.request("POST", f"/api/v1/namespaces/{NS}/secrets", secret)
    assert response.status == 400  # the Go decoder refuses it
    secret["data"]["k"] = base64.b64encode(b"v").decode()
    secret["stringData"] = {"plain": "text"}
    stored = await api.request("POST", f"/api/v1/namespaces/{NS}/secrets", secret)
    assert stored.status == 201 and "stringData" not in stored.body
    assert base64.b64decode(stored.body["data"]["plain"]) == b"text"
    assert api.get(WZ, NS, "nothing") is None
