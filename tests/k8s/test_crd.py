"""The WaltzCluster CRD: a valid Kubernetes object, and a schema that takes the examples
and refuses bad resources naming the field, including its CEL rules: those on the
resource's name, those between fields, and the transition rules (``oldSelf``) that keep
the fields fixed at creation fixed, evaluated wherever they are in the schema as the API
server evaluates them."""

from __future__ import annotations

import copy
import pathlib
import re
from typing import Any

import celpy
import jsonschema
import kubernetes_validate
import pytest
import yaml
from celpy import celtypes

from waltz_operator.desired import desired_objects
from waltz_operator.spec import parse

ROOT = pathlib.Path(__file__).resolve().parents[2]
CRD = yaml.safe_load((ROOT / "crds" / "waltzclusters.yaml").read_text())
VERSION = CRD["spec"]["versions"][0]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]
EXAMPLES = sorted((ROOT / "examples").glob("waltzcluster-*.yaml"))


@pytest.mark.parametrize("kubernetes", ["1.30.0", "1.34.0", "1.37.0"])
def test_the_crd_is_a_valid_object_for_kubernetes(kubernetes):
    assert kubernetes_validate.validate(CRD, kubernetes, strict=True)


def test_the_validator_is_strict():
    bad = copy.deepcopy(CRD)
    bad["spec"]["scopee"] = "Namespaced"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.34.0", strict=True)


def test_names_subresources_and_printer_columns():
    names = CRD["spec"]["names"]
    assert (CRD["spec"]["group"], names["kind"], names["shortNames"], names["categories"]) == (
        "waltz.io",
        "WaltzCluster",
        ["wz"],
        ["all"],
    )
    assert (VERSION["name"], VERSION["served"], VERSION["storage"]) == ("v1alpha1", True, True)
    assert VERSION["subresources"]["status"] == {}
    assert VERSION["subresources"]["scale"]["specReplicasPath"] == ".spec.storage.replicas"
    columns = [c["name"] for c in VERSION["additionalPrinterColumns"]]
    assert columns == ["Ready", "Storage", "Servers", "Partitions", "Quorum", "Age"]


def _fields(schema: dict, path: str = ""):
    """Every property in the schema, with its path."""
    for name, sub in schema.get("properties", {}).items():
        yield f"{path}.{name}", sub
        yield from _fields(sub, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from _fields(schema[key], f"{path}[]")


def test_every_field_has_a_description():
    missing = [
        path
        for path, sub in _fields(SCHEMA["properties"]["spec"], ".spec")
        if "description" not in sub
    ]
    missing += [
        p for p, s in _fields(SCHEMA["properties"]["status"], ".status") if "description" not in s
    ]
    assert missing == []


def _validate(resource: dict) -> None:
    jsonschema.validate(resource, SCHEMA, cls=jsonschema.Draft7Validator)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_the_examples_are_valid(path):
    resource = yaml.safe_load(path.read_text())
    _validate(resource)
    assert _cel_failures(resource) == []  # created
    assert _cel_failures(resource, resource) == []  # applied again unchanged


def _minimal() -> dict:
    return yaml.safe_load((ROOT / "examples" / "waltzcluster-minimal.yaml").read_text())


@pytest.mark.parametrize(
    ("change", "field", "why"),
    [
        (lambda s: s.update(partitions=0), ["spec", "partitions"], "less than the minimum"),
        (lambda s: s.update(replicasPerPartition=9), ["spec", "replicasPerPartition"], "maximum"),
        (lambda s: s.pop("zookeeper"), ["spec"], "'zookeeper' is a required property"),
        (lambda s: s["zookeeper"].pop("connect"), ["spec", "zookeeper"], "'connect' is a required"),
        (lambda s: s["zookeeper"].update(root="waltz"), ["spec", "zookeeper", "root"], "match"),
        (lambda s: s.update(storage={"size": "ten gigs"}), ["spec", "storage", "size"], "match"),
        (lambda s: s.update(storage={"replicas": -1}), ["spec", "storage", "replicas"], "minimum"),
        (
            lambda s: s.update(image={"pullPolicy": "Sometimes"}),
            ["spec", "image", "pullPolicy"],
            "is not one of",
        ),
        (
            lambda s: s.update(server={"settings": {"max_queue": 5}}),
            ["spec", "server", "settings", "max_queue"],
            "is not of type 'string'",
        ),
        (lambda s: s.update(paused="yes"), ["spec", "paused"], "is not of type 'boolean'"),
        (
            lambda s: s.update(storage={"replaceLostAfterSeconds": -1}),
            ["spec", "storage", "replaceLostAfterSeconds"],
            "less than the minimum",
        ),
        (
            lambda s: s.update(storage={"replaceLostAfterSeconds": 2592001}),
            ["spec", "storage", "replaceLostAfterSeconds"],
            "greater than the maximum",
        ),
        (
            lambda s: s.update(storage={"replaceLostAfterSeconds": "10m"}),
            ["spec", "storage", "replaceLostAfterSeconds"],
            "is not of type 'integer'",
        ),
        (lambda s: s.update(logFormat="yaml"), ["spec", "logFormat"], "is not one of"),
        (lambda s: s.update(logFormat="JSON"), ["spec", "logFormat"], "is not one of"),
    ],
    ids=[
        "no-partitions",
        "too-many-replicas",
        "no-zookeeper",
        "no-connect",
        "relative-root",
        "bad-size",
        "negative-storage",
        "bad-pull-policy",
        "setting-not-a-string",
        "paused-not-boolean",
        "negative-replace-lost-after",
        "replace-lost-after-over-30-days",
        "replace-lost-after-not-seconds",
        "log-format-unknown",
        "log-format-upper-case",
    ],
)
def test_bad_resources_are_refused_naming_the_field(change, field, why):
    resource = _minimal()
    change(resource["spec"])
    with pytest.raises(jsonschema.ValidationError) as info:
        _validate(resource)
    assert list(info.value.absolute_path) == field
    assert why in info.value.message


# --- the CEL rules, evaluated as the API server would (with defaults applied) -----------


def _quantity(value) -> celtypes.DoubleType:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
    units |= {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
    text = str(value)
    for unit in sorted(units, key=len, reverse=True):
        if text.endswith(unit):
            return celtypes.DoubleType(float(text[: -len(unit)]) * units[unit])
    return celtypes.DoubleType(float(text))


def _compare_to(a, b) -> celtypes.IntType:
    return celtypes.IntType((a > b) - (a < b))


def _defaults(schema: dict, value):
    """Fill in the schema's defaults, as the API server does before the rules run (and
    when it reads a stored object: ``oldSelf`` has them too)."""
    if not isinstance(value, dict):
        return value
    for name, sub in schema.get("properties", {}).items():
        if name not in value and "default" in sub:
            value[name] = copy.deepcopy(sub["default"])
        if name in value:
            value[name] = _defaults(sub, value[name])
    return value


_MISSING = object()  # no old value: a create, or a field the old object did not have
_CEL = celpy.Environment()
_PROGRAMS: dict[str, Any] = {}


def _program(rule: str):
    if rule not in _PROGRAMS:
        _PROGRAMS[rule] = _CEL.program(
            _CEL.compile(rule), functions={"quantity": _quantity, "compareTo": _compare_to}
        )
    return _PROGRAMS[rule]


def _is_transition_rule(rule: str) -> bool:
    return re.search(r"\boldSelf\b", rule) is not None


def _evaluate(schema: dict, new, old, path: str, failed: list[tuple[str, str]]) -> None:
    """Every rule of ``schema`` and of the schemas under it, with ``self`` the value there.
    As the API server does: a transition rule (one naming ``oldSelf``) runs only where the
    old object has a value to compare with, which a list item has only in a map list."""
    for rule in schema.get("x-kubernetes-validations", []):
        activation = {"self": celpy.json_to_cel(new)}
        if _is_transition_rule(rule["rule"]):
            if old is _MISSING:
                continue
            activation["oldSelf"] = celpy.json_to_cel(old)
        if not _program(rule["rule"]).evaluate(activation):
            failed.append(((path + rule.get("fieldPath", "")).lstrip("."), rule["message"]))
    if isinstance(new, dict):
        extra = schema.get("additionalProperties")
        for name, value in new.items():
            sub = schema.get("properties", {}).get(name, extra)
            if isinstance(sub, dict):
                before = old.get(name, _MISSING) if isinstance(old, dict) else _MISSING
                _evaluate(sub, value, before, f"{path}.{name}", failed)
    elif isinstance(new, list) and isinstance(schema.get("items"), dict):
        keys = schema.get("x-kubernetes-list-map-keys", [])
        correlated = schema.get("x-kubernetes-list-type") == "map" and isinstance(old, list)
        for i, item in enumerate(new):
            before = _MISSING
            if correlated:
                same = [o for o in old if all(o.get(k) == item.get(k) for k in keys)]
                before = same[0] if same else _MISSING
            _evaluate(schema["items"], item, before, f"{path}[{i}]", failed)


def _cel_failures(new: dict, old: dict | None = None) -> list[tuple[str, str]]:
    """(field path as the API server reports it, message) of every rule that fails for
    ``new`` created (``old`` None) or replacing ``old``. A rule at the root of the schema
    (the one on metadata.name) reports the path ""."""
    failed: list[tuple[str, str]] = []
    before = _MISSING if old is None else _defaults(SCHEMA, copy.deepcopy(old))
    _evaluate(SCHEMA, _defaults(SCHEMA, copy.deepcopy(new)), before, "", failed)
    return failed


def _all_rules(schema: dict = SCHEMA, path: str = "") -> list[tuple[str, str]]:
    """(field path, message) of every rule in the schema (YAML anchors repeat some)."""
    found = [
        ((path + r.get("fieldPath", "")).lstrip("."), r["message"])
        for r in schema.get("x-kubernetes-validations", [])
    ]
    for name, sub in schema.get("properties", {}).items():
        found += _all_rules(sub, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            found += _all_rules(schema[key], f"{path}[]")
    return found


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        (lambda s: s.update(replicasPerPartition=2), "spec.replicasPerPartition", "must be odd"),
        (
            lambda s: s.update(replicasPerPartition=5, storage={"replicas": 3}),
            "spec.storage.replicas",
            "at least replicasPerPartition",
        ),
        (
            lambda s: s.update(tls={"storageSecret": "storage-tls"}),
            "spec.tls",
            "needs both storageSecret and serverSecret",
        ),
        (
            lambda s: s.update(tls={"mode": "secrets"}),
            "spec.tls.mode",
            "given with tls.mode secrets, and only then",
        ),
        (
            lambda s: s.update(tls={"mode": "operator", "storageSecret": "a", "serverSecret": "b"}),
            "spec.tls.mode",
            "given with tls.mode secrets, and only then",
        ),
    ],
    ids=["even-replicas", "too-few-storage-nodes", "half-tls", "secrets-none", "operator-secrets"],
)
def test_cel_rules_refuse_a_bad_resource(change, field, words):
    resource = _minimal()
    change(resource["spec"])
    _validate(resource)  # the schema alone takes it
    failures = _cel_failures(resource)
    assert [f for f, _ in failures] == [field]
    assert words in failures[0][1]


# --- the name --------------------------------------------------------------------------

LONGEST_NAME = "w" + "a" * 43  # 44 characters


@pytest.mark.parametrize("name", ["a", "demo", "payments-eu-1", LONGEST_NAME])
def test_names_that_fit_every_derived_name_are_taken(name):
    resource = _minimal()
    resource["metadata"]["name"] = name
    assert _cel_failures(resource) == []


@pytest.mark.parametrize(
    "name",
    [LONGEST_NAME + "a", "1demo", "demo.prod", "Demo", "demo-", "-demo", "de_mo"],
    ids=[
        "45-characters",
        "leading-digit",
        "dot",
        "upper-case",
        "trailing-dash",
        "leading-dash",
        "underscore",
    ],
)
def test_names_that_break_a_derived_name_are_refused(name):
    resource = _minimal()
    resource["metadata"]["name"] = name
    failures = _cel_failures(resource)
    assert [f for f, _ in failures] == [""]  # a rule at the root of the schema
    assert "metadata.name must be at most 44 characters" in failures[0][1]


# The longest controller-revision-hash a StatefulSet gives its pods: the name, "-", and a
# 32-bit FNV hash in decimal (at most 10 digits, spelled with SafeEncodeString's
# alphabet; the hash also covers the collision count, still 32 bits).
LONGEST_REVISION_HASH = "4294967295"
DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
STORAGE = SCHEMA["properties"]["spec"]["properties"]["storage"]["properties"]
STORAGE_REPLICAS_MAX = STORAGE["replicas"]["maximum"]


def test_the_longest_name_keeps_every_derived_name_within_kubernetes_limits():
    """The arithmetic behind 44, on the objects the operator makes: the storage
    StatefulSet's name plus "-" and its revision hash is its pods' controller-revision-hash
    label (at most 63); its pods' names (the highest ordinal) are DNS labels, host names
    of the headless Service; every Service name is a DNS-1035 label; every label value
    fits 63."""
    resource = _minimal()
    resource["metadata"].update(name=LONGEST_NAME, namespace="waltz", uid="u-1")
    resource["spec"]["storage"] = {"replicas": STORAGE_REPLICAS_MAX}
    made = desired_objects(parse(resource))
    (statefulset,) = [o for o in made if o["kind"] == "StatefulSet"]
    name = statefulset["metadata"]["name"]
    assert len(f"{name}-{LONGEST_REVISION_HASH}") <= 63
    # ... and 44 is the most: one more character and the revision label would not fit.
    suffix = name.removeprefix(LONGEST_NAME)
    assert len(f"{LONGEST_NAME}a{suffix}-{LONGEST_REVISION_HASH}") > 63
    last_pod = f"{name}-{STORAGE_REPLICAS_MAX - 1}"
    assert len(last_pod) <= 63 and DNS_1123_LABEL.match(last_pod)
    for obj in made:
        if obj["kind"] == "Service":
            assert DNS_1035_LABEL.match(obj["metadata"]["name"]), obj["metadata"]["name"]
            assert len(obj["metadata"]["name"]) <= 63
        for value in (obj["metadata"].get("labels") or {}).values():
            assert len(value) <= 63


# --- fields fixed at creation, and fields that only grow: transition rules ---------------


def _established() -> dict:
    """A cluster with every fixed field set, as it was created."""
    resource = _minimal()
    resource["spec"].update(
        partitions=8,
        replicasPerPartition=3,
        storage={"replicas": 5, "size": "20Gi", "storageClassName": "fast-ssd"},
    )
    resource["spec"]["zookeeper"]["root"] = "/waltz/payments"
    return resource


def _without(key: str):
    return lambda s: s.pop(key)


# (what the old resource had changed from _established(), the update, the field, words)
REFUSED_UPDATES = {
    # Partitions grow online (ALLOWED_UPDATES), but never shrink.
    "fewer-partitions": (
        None,
        lambda s: s.update(partitions=4),
        "spec.partitions",
        "partitions never shrink",
    ),
    "fewer-than-the-default-partitions": (
        lambda s: s.pop("partitions"),
        lambda s: s.update(partitions=3),
        "spec.partitions",
        "partitions never shrink",
    ),
    "more-replicas-per-partition": (
        None,
        lambda s: s.update(replicasPerPartition=5),
        "spec.replicasPerPartition",
        "replicasPerPartition cannot change",
    ),
    "other-connect": (
        None,
        lambda s: s["zookeeper"].update(connect="zk.other.svc:2181"),
        "spec.zookeeper.connect",
        "zookeeper.connect cannot change",
    ),
    "other-root": (
        None,
        lambda s: s["zookeeper"].update(root="/waltz/elsewhere"),
        "spec.zookeeper.root",
        "zookeeper.root cannot be set, changed or removed",
    ),
    "root-removed": (
        None,
        lambda s: s["zookeeper"].pop("root"),
        "spec.zookeeper.root",
        "zookeeper.root cannot be set, changed or removed",
    ),
    "root-added": (
        lambda s: s["zookeeper"].pop("root"),
        lambda s: s["zookeeper"].update(root="/waltz/payments"),
        "spec.zookeeper.root",
        "zookeeper.root cannot be set, changed or removed",
    ),
    # Even the root the operator defaults to: the rule cannot see the namespace, and
    # setting it gains nothing.
    "default-root-spelled-out": (
        lambda s: s["zookeeper"].pop("root"),
        lambda s: s["zookeeper"].update(root="/waltz/default/demo"),
        "spec.zookeeper.root",
        "zookeeper.root cannot be set, changed or removed",
    ),
    "other-storage-class": (
        None,
        lambda s: s["storage"].update(storageClassName="standard"),
        "spec.storage.storageClassName",
        "storage.storageClassName cannot change",
    ),
    "storage-class-added": (
        lambda s: s["storage"].pop("storageClassName"),
        lambda s: s["storage"].update(storageClassName="fast-ssd"),
        "spec.storage.storageClassName",
        "storage.storageClassName cannot change",
    ),
    "storage-class-removed": (
        None,
        lambda s: s["storage"].pop("storageClassName"),
        "spec.storage.storageClassName",
        "storage.storageClassName cannot change",
    ),
    "smaller-volumes": (
        None,
        lambda s: s["storage"].update(size="19Gi"),
        "spec.storage.size",
        "storage.size can never decrease",
    ),
    # A running cluster cannot switch how its pods authenticate each other.
    "tls-operator-to-disabled": (
        lambda s: s.update(tls={"mode": "operator"}),
        lambda s: s.update(tls={"mode": "disabled"}),
        "spec.tls.mode",
        "tls.mode cannot change once set",
    ),
    "tls-disabled-to-operator": (
        lambda s: s.update(tls={"mode": "disabled"}),
        lambda s: s.update(tls={"mode": "operator"}),
        "spec.tls.mode",
        "tls.mode cannot change once set",
    ),
    "tls-mode-removed": (
        lambda s: s.update(tls={"mode": "disabled"}),
        lambda s: s["tls"].pop("mode"),
        "spec.tls.mode",
        "tls.mode cannot change once set",
    ),
}


def _update(before, change):
    old = _established()
    if before is not None:
        before(old["spec"])
    new = copy.deepcopy(old)
    change(new["spec"])
    return old, new


@pytest.mark.parametrize(
    ("before", "change", "field", "words"), REFUSED_UPDATES.values(), ids=REFUSED_UPDATES
)
def test_transition_rules_refuse_changing_a_fixed_field(before, change, field, words):
    old, new = _update(before, change)
    _validate(new)  # the schema alone takes it ...
    assert _cel_failures(new) == []  # ... and so do the rules, for a new resource
    failures = _cel_failures(new, old)
    assert [f for f, _ in failures] == [field]
    assert words in failures[0][1]


ALLOWED_UPDATES = {
    "grow-partitions": lambda s: s.update(partitions=16),
    "scale-storage-up": lambda s: s["storage"].update(replicas=7),
    "scale-storage-down": lambda s: s["storage"].update(replicas=3),
    "grow-volumes": lambda s: s["storage"].update(size="1Ti"),
    "same-size-spelled-otherwise": lambda s: s["storage"].update(size="20480Mi"),
    "scale-servers": lambda s: s.update(server={"replicas": 4}),
    "new-image": lambda s: s.update(image={"tag": "0.2.0"}),
    "settings": lambda s: s["storage"].update(settings={"segment_bytes": "1GiB"}),
    "scheduling": lambda s: s["storage"].update(
        priorityClassName="waltz-critical",
        tolerations=[{"key": "dedicated", "operator": "Exists"}],
        affinity={"nodeAffinity": {}},
    ),
    "paused": lambda s: s.update(paused=True),
    "zookeeper-credential": lambda s: s["zookeeper"].update(authSecret="zk-auth"),
    # Written once where it was not (the operator records the mode it runs with).
    "tls-mode-recorded": lambda s: s.update(tls={"mode": "disabled"}),
}


@pytest.mark.parametrize("change", ALLOWED_UPDATES.values(), ids=ALLOWED_UPDATES)
def test_ordinary_updates_pass_every_rule(change):
    old, new = _update(None, change)
    _validate(new)
    assert _cel_failures(new, old) == []


def test_an_empty_storage_class_is_the_same_as_none():
    """The operator treats "" as unset (the cluster's default class): so do the rules."""
    old, new = _update(
        lambda s: s["storage"].pop("storageClassName"),
        lambda s: s["storage"].update(storageClassName=""),
    )
    assert _cel_failures(new, old) == []


def test_every_rule_is_exercised_by_a_refusal():
    """Each rule of the CRD fails in one of the cases above: a rule added without a test,
    or one whose refusal stopped working, fails here."""
    refused = set()
    for before, change, _, _ in REFUSED_UPDATES.values():
        old, new = _update(before, change)
        refused.update(_cel_failures(new, old))
    for change in (
        lambda s: s.update(replicasPerPartition=2),
        lambda s: s.update(replicasPerPartition=5, storage={"replicas": 3}),
        lambda s: s.update(tls={"storageSecret": "storage-tls"}),
        lambda s: s.update(tls={"mode": "secrets"}),
    ):
        resource = _minimal()
        change(resource["spec"])
        refused.update(_cel_failures(resource))
    resource = _minimal()
    resource["metadata"]["name"] = "1demo"
    refused.update(_cel_failures(resource))
    assert set(_all_rules()) == refused


# --- the tiers' scheduling fields ------------------------------------------------------

TIER_POD_FIELDS = [
    "resources",
    "affinity",
    "tolerations",
    "topologySpreadConstraints",
    "priorityClassName",
    "podSecurityContext",
]


@pytest.mark.parametrize("tier", ["storage", "server"])
def test_both_tiers_take_the_pod_scheduling_fields(tier):
    fields = SCHEMA["properties"]["spec"]["properties"][tier]["properties"]
    assert set(TIER_POD_FIELDS) <= set(fields)
    # The core/v1 types are kept whole for the API server to check on the pods.
    assert fields["affinity"]["x-kubernetes-preserve-unknown-fields"] is True
    assert fields["podSecurityContext"]["x-kubernetes-preserve-unknown-fields"] is True
    for name in ("tolerations", "topologySpreadConstraints"):
        assert fields[name]["items"]["x-kubernetes-preserve-unknown-fields"] is True
    resource = _minimal()
    resource["spec"][tier] = {
        "priorityClassName": "waltz-critical",
        "topologySpreadConstraints": [
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "ScheduleAnyway",
            }
        ],
    }
    _validate(resource)
    resource["spec"][tier]["priorityClassName"] = "Waltz Critical"
    with pytest.raises(jsonschema.ValidationError) as info:
        _validate(resource)
    assert list(info.value.absolute_path) == ["spec", tier, "priorityClassName"]


def test_partitions_grow_from_the_default_too():
    """A resource created without spec.partitions has the default, 4, and may grow."""
    old, new = _update(lambda s: s.pop("partitions"), lambda s: s.update(partitions=5))
    assert _cel_failures(new, old) == []


def test_the_partitions_description_says_they_grow_and_never_shrink():
    partitions = SCHEMA["properties"]["spec"]["properties"]["partitions"]["description"]
    assert "Can grow, never shrink" in partitions and "fixed at creation" not in partitions
    assert "docs/operations.md#growing-the-partitions" in partitions


def test_log_format_is_text_or_json_and_text_by_default():
    field = SCHEMA["properties"]["spec"]["properties"]["logFormat"]
    assert (field["type"], field["enum"], field["default"]) == ("string", ["text", "json"], "text")
    for value in ("text", "json"):
        resource = _minimal()
        resource["spec"]["logFormat"] = value
        _validate(resource)
        assert parse(resource).log_format == value
