"""The resources the server serves: the built-in kinds the operator touches, and custom
resources registered from CustomResourceDefinition documents; and the discovery
documents (``/api``, ``/apis``, ``/apis/<group>/<version>``) kopf reads to find them."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .cel import compile_check
from .errors import bad_request
from .schema import ANY, Schema, _definitions, builtin_schema


@dataclass
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    subresources: tuple[str, ...] = ()
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    custom: bool = False
    # metadata.generation is kept (kinds with a spec the controllers observe)
    generation: bool = False
    # scale subresource paths (custom resources: from the CRD)
    scale: Mapping[str, str] = field(default_factory=dict)
    schema: Schema | None = None  # None: anything goes (only structure checks)
    crd_name: str = ""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> str:
        """``apps/v1/statefulsets``, ``v1/pods``: how tests name a resource."""
        return f"{self.api_version}/{self.plural}"

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def schema_or_any(self) -> Schema:
        return self.schema or ANY

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        prefix = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        ns = f"/namespaces/{namespace}" if namespace and self.namespaced else ""
        return f"{prefix}{ns}/{self.plural}" + (f"/{name}" if name else "")


# (group, version, plural, kind, namespaced, subresources, short names, generation)
BUILTINS: list[tuple[str, str, str, str, bool, tuple[str, ...], tuple[str, ...], bool]] = [
    ("", "v1", "namespaces", "Namespace", False, ("status", "finalize"), ("ns",), False),
    ("", "v1", "nodes", "Node", False, ("status",), ("no",), False),
    ("", "v1", "events", "Event", True, (), ("ev",), False),
    ("", "v1", "pods", "Pod", True, ("status",), ("po",), True),
    ("", "v1", "services", "Service", True, ("status",), ("svc",), False),
    ("", "v1", "configmaps", "ConfigMap", True, (), ("cm",), False),
    ("", "v1", "secrets", "Secret", True, (), (), False),
    (
        "",
        "v1",
        "persistentvolumeclaims",
        "PersistentVolumeClaim",
        True,
        ("status",),
        ("pvc",),
        False,
    ),
    ("apps", "v1", "statefulsets", "StatefulSet", True, ("status", "scale"), ("sts",), True),
    ("apps", "v1", "deployments", "Deployment", True, ("status", "scale"), ("deploy",), True),
    ("apps", "v1", "replicasets", "ReplicaSet", True, ("status", "scale"), ("rs",), True),
    (
        "policy",
        "v1",
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        True,
        ("status",),
        ("pdb",),
        True,
    ),
    ("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", True, (), ("netpol",), True),
    ("events.k8s.io", "v1", "events", "Event", True, (), ("ev",), False),
    ("coordination.k8s.io", "v1", "leases", "Lease", True, (), (), False),
    ("storage.k8s.io", "v1", "storageclasses", "StorageClass", False, (), ("sc",), False),
    (
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        False,
        ("status",),
        ("crd", "crds"),
        True,
    ),
]


def builtin_types() -> list[ResourceType]:
    out = []
    for group, version, plural, kind, namespaced, subs, short, generation in BUILTINS:
        out.append(
            ResourceType(
                group,
                version,
                plural,
                kind,
                namespaced,
                subs,
                short,
                generation=generation,
                scale=(
                    {
                        "specReplicasPath": ".spec.replicas",
                        "statusReplicasPath": ".status.replicas",
                        "labelSelectorPath": ".status.selector",
                    }
                    if "scale" in subs
                    else {}
                ),
                schema=builtin_schema(group, version, kind),
            )
        )
    return out


def _object_meta() -> dict[str, Any]:
    return {"$ref": "#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}


def custom_types(crd: Mapping[str, Any]) -> list[ResourceType]:
    """The served versions of a CustomResourceDefinition; 400 if it is not structural
    enough to serve (no schema, or a CEL rule that does not compile)."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    out = []
    for version in spec.get("versions") or []:
        if not version.get("served", True):
            continue
        schema = copy.deepcopy(((version.get("schema") or {}).get("openAPIV3Schema")) or {})
        if not schema:
            raise bad_request(
                f"spec.versions[{version.get('name')}].schema.openAPIV3Schema: Required value"
            )
        _check_rules(schema)
        # metadata is ObjectMeta whatever the CRD says (kube-apiserver validates it so).
        schema.setdefault("properties", {})["metadata"] = _object_meta()
        subresources = version.get("subresources") or {}
        out.append(
            ResourceType(
                spec["group"],
                version["name"],
                names["plural"],
                names["kind"],
                spec.get("scope", "Namespaced") == "Namespaced",
                tuple(s for s in ("status", "scale") if s in subresources),
                tuple(names.get("shortNames") or ()),
                tuple(names.get("categories") or ()),
                custom=True,
                generation=True,
                scale=subresources.get("scale") or {},
                schema=Schema(schema, _definitions()),
                crd_name=(crd.get("metadata") or {}).get("name", ""),
            )
        )
    return out


def _check_rules(node: Any) -> None:
    if isinstance(node, Mapping):
        for rule in node.get("x-kubernetes-validations") or []:
            try:
                compile_check(rule["rule"])
                if rule.get("messageExpression"):
                    compile_check(rule["messageExpression"])
            except Exception as e:
                raise bad_request(f"x-kubernetes-validations: compilation failed: {e}") from e
        for value in node.values():
            _check_rules(value)
    elif isinstance(node, list):
        for value in node:
            _check_rules(value)


class Registry:
    def __init__(self) -> None:
        self.types: list[ResourceType] = builtin_types()

    def add_crd(self, crd: Mapping[str, Any]) -> list[ResourceType]:
        added = custom_types(crd)
        name = (crd.get("metadata") or {}).get("name", "")
        self.types = [t for t in self.types if t.crd_name != name or not name] + added
        return added

    def remove_crd(self, name: str) -> None:
        self.types = [t for t in self.types if t.crd_name != name]

    def find(self, group: str, version: str, plural: str) -> ResourceType | None:
        for t in self.types:
            if (t.group, t.version, t.plural) == (group, version, plural):
                return t
        return None

    def by_kind(self, api_version: str, kind: str) -> ResourceType | None:
        for t in self.types:
            if (t.api_version, t.kind) == (api_version, kind):
                return t
        return None

    def resolve(self, name: str) -> ResourceType:
        """A resource named as tests name it: ``apps/v1/statefulsets``, ``statefulsets``,
        ``StatefulSet``, ``sts``, ``waltz.io/v1alpha1/waltzclusters``."""
        for t in self.types:
            if name in (t.key, t.plural, t.kind, t.singular, *t.short_names):
                if t.group == "events.k8s.io" and name in ("events", "Event", "ev"):
                    continue  # core/v1 Events are what a bare name means
                return t
            if name == f"{t.plural}.{t.group}":
                return t
        raise KeyError(f"no resource {name!r}")

    # --- discovery -----------------------------------------------------------------------

    def groups(self) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for t in self.types:
            if t.group and t.version not in found.setdefault(t.group, []):
                found[t.group].append(t.version)
        return found

    def api_group_list(self) -> dict[str, Any]:
        groups = []
        for group, versions in self.groups().items():
            entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
            groups.append({"name": group, "versions": entries, "preferredVersion": entries[0]})
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

    def api_group(self, group: str) -> dict[str, Any] | None:
        versions = self.groups().get(group)
        if not versions:
            return None
        entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": group,
            "versions": entries,
            "preferredVersion": entries[0],
        }

    def resource_list(self, group: str, version: str) -> dict[str, Any] | None:
        chosen = [t for t in self.types if (t.group, t.version) == (group, version)]
        if not chosen:
            return None
        resources: list[dict[str, Any]] = []
        for t in chosen:
            verbs = [
                "create",
                "delete",
                "deletecollection",
                "get",
                "list",
                "patch",
                "update",
                "watch",
            ]
            entry: dict[str, Any] = {
                "name": t.plural,
                "singularName": t.singular,
                "namespaced": t.namespaced,
                "kind": t.kind,
                "verbs": verbs,
            }
            if t.short_names:
                entry["shortNames"] = list(t.short_names)
            if t.categories:
                entry["categories"] = list(t.categories)
            resources.append(entry)
            for sub in t.subresources:
                sub_entry: dict[str, Any] = {
                    "name": f"{t.plural}/{sub}",
                    "singularName": "",
                    "namespaced": t.namespaced,
                    "kind": t.kind,
                    "verbs": ["get", "patch", "update"],
                }
                if sub == "scale":
                    sub_entry.update(kind="Scale", group="autoscaling", version="v1")
                if sub == "finalize":
                    sub_entry["verbs"] = ["update"]
                resources.append(sub_entry)
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": resources,
        }
