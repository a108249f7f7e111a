"""The WaltzCluster CRD: a valid Kubernetes object, and a schema that takes the examples
and refuses bad resources naming the field, including its CEL rules."""

from __future__ import annotations

import copy
import pathlib

import celpy
import jsonschema
import kubernetes_validate
import pytest
import yaml
from celpy import celtypes

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
    assert _cel_failures(resource, resource) == []


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
    """Fill in the schema's defaults, as the API server does before the rules run."""
    if not isinstance(value, dict):
        return value
    for name, sub in schema.get("properties", {}).items():
        if name not in value and "default" in sub:
            value[name] = copy.deepcopy(sub["default"])
        if name in value:
            value[name] = _defaults(sub, value[name])
    return value


def _cel_failures(new: dict, old: dict) -> list[tuple[str, str]]:
    """(fieldPath, message) of every spec rule that fails for ``new`` replacing ``old``."""
    spec_schema = SCHEMA["properties"]["spec"]
    spec = _defaults(spec_schema, copy.deepcopy(new["spec"]))
    old_spec = _defaults(spec_schema, copy.deepcopy(old["spec"]))
    env = celpy.Environment()
    failed = []
    for rule in spec_schema["x-kubernetes-validations"]:
        program = env.program(
            env.compile(rule["rule"]), functions={"quantity": _quantity, "compareTo": _compare_to}
        )
        ok = program.evaluate(
            {"self": celpy.json_to_cel(spec), "oldSelf": celpy.json_to_cel(old_spec)}
        )
        if not ok:
            failed.append((rule["fieldPath"], rule["message"]))
    return failed


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        (lambda s: s.update(replicasPerPartition=2), ".replicasPerPartition", "must be odd"),
        (
            lambda s: s.update(replicasPerPartition=5, storage={"replicas": 3}),
            ".storage.replicas",
            "at least replicasPerPartition",
        ),
        (
            lambda s: s.update(tls={"storageSecret": "storage-tls"}),
            ".tls",
            "needs both storageSecret and serverSecret",
        ),
    ],
    ids=["even-replicas", "too-few-storage-nodes", "half-tls"],
)
def test_cel_rules_refuse_a_bad_resource(change, field, words):
    resource = _minimal()
    change(resource["spec"])
    _validate(resource)  # the schema alone takes it
    failures = _cel_failures(resource, resource)
    assert [f for f, _ in failures] == [field]
    assert words in failures[0][1]


def test_cel_rules_refuse_shrinking_partitions_or_volumes():
    old = _minimal()
    old["spec"].update(partitions=8, storage={"size": "20Gi"})
    grown = copy.deepcopy(old)
    grown["spec"].update(partitions=16, storage={"size": "1Ti"})
    assert _cel_failures(grown, old) == []
    fewer = copy.deepcopy(old)
    fewer["spec"]["partitions"] = 4
    assert [f for f, _ in _cel_failures(fewer, old)] == [".partitions"]
    smaller = copy.deepcopy(old)
    smaller["spec"]["storage"] = {"size": "19Gi"}
    assert [f for f, _ in _cel_failures(smaller, old)] == [".storage.size"]
