"""A view on an OpenAPI v3 schema node: what the validator, the pruner, server-side apply
and strategic merge need to know about a field (its types, its children, how its list
merges). One class for both kinds of schema the server knows:

* a CRD's structural schema (``openAPIV3Schema``), as written in the CRD;
* a built-in kind's schema, from the Kubernetes OpenAPI documents that the
  ``kubernetes-validate`` package ships (``$ref`` into ``_definitions.json``; types
  like ``["string", "null"]``; Quantity and IntOrString as ``oneOf``).
"""

from __future__ import annotations

import functools
import json
import pathlib
from collections.abc import Mapping
from typing import Any

# The Kubernetes version whose built-in schemas the server serves.
KUBERNETES_VERSION = "1.34.0"


class Schema:
    """One node. ``defs`` resolves ``$ref`` (built-in schemas only)."""

    __slots__ = ("__dict__", "_defs", "node")

    def __init__(self, node: Mapping[str, Any], defs: Mapping[str, Any] | None = None) -> None:
        self._defs = defs
        self.node = self._resolve(node)

    def _resolve(self, node: Mapping[str, Any]) -> Mapping[str, Any]:
        while "$ref" in node and self._defs is not None:
            name = node["$ref"].rsplit("/", 1)[-1]
            node = self._defs[name]
        return node

    def child(self, node: Mapping[str, Any]) -> Schema:
        return Schema(node, self._defs)

    # --- types ---------------------------------------------------------------------------

    @functools.cached_property
    def types(self) -> frozenset[str]:
        """The JSON types allowed here; empty: anything (e.g. preserve-unknown)."""
        if self.node.get("x-kubernetes-int-or-string"):
            return frozenset({"integer", "string"})
        declared = self.node.get("type")
        if declared is None and "oneOf" in self.node:
            found: set[str] = set()
            for option in self.node["oneOf"]:
                t = self.child(option).node.get("type")
                found.update([t] if isinstance(t, str) else t or [])
            found.discard("null")
            return frozenset(found)
        if isinstance(declared, list):
            return frozenset(t for t in declared if t != "null")
        return frozenset([declared]) if declared else frozenset()

    @property
    def nullable(self) -> bool:
        declared = self.node.get("type")
        return bool(self.node.get("nullable")) or (
            isinstance(declared, list) and "null" in declared
        )

    @property
    def preserve_unknown(self) -> bool:
        return bool(self.node.get("x-kubernetes-preserve-unknown-fields"))

    @property
    def embedded_resource(self) -> bool:
        return bool(self.node.get("x-kubernetes-embedded-resource"))

    # --- children ------------------------------------------------------------------------

    @property
    def properties(self) -> Mapping[str, Any]:
        return self.node.get("properties") or {}

    def prop(self, name: str) -> Schema | None:
        """The schema of field ``name`` of an object here; None: an unknown field."""
        if name in self.properties:
            return self.child(self.properties[name])
        extra = self.node.get("additionalProperties")
        if isinstance(extra, Mapping):
            return self.child(extra)
        if extra is True or self.preserve_unknown or (not self.properties and not self.types):
            return ANY
        return None

    def items(self) -> Schema:
        items = self.node.get("items")
        return self.child(items) if isinstance(items, Mapping) else ANY

    @property
    def required(self) -> list[str]:
        return list(self.node.get("required") or [])

    # --- how lists and maps merge --------------------------------------------------------

    @property
    def list_type(self) -> str:
        """atomic, set or map (CRDs default to atomic; so do built-in lists without one,
        unless their patch strategy merges them)."""
        declared = self.node.get("x-kubernetes-list-type")
        if declared:
            return declared
        if "merge" in (self.node.get("x-kubernetes-patch-strategy") or ""):
            return "map" if self.node.get("x-kubernetes-patch-merge-key") else "set"
        return "atomic"

    @property
    def map_keys(self) -> list[str]:
        keys = self.node.get("x-kubernetes-list-map-keys")
        if keys:
            return list(keys)
        merge_key = self.node.get("x-kubernetes-patch-merge-key")
        return [merge_key] if merge_key else []

    @property
    def atomic_map(self) -> bool:
        return self.node.get("x-kubernetes-map-type") == "atomic"

    @property
    def patch_merge_key(self) -> str | None:
        """Strategic merge patch's key of a list (None: the list is replaced)."""
        if "merge" not in (self.node.get("x-kubernetes-patch-strategy") or ""):
            return None
        return self.node.get("x-kubernetes-patch-merge-key") or ""


ANY = Schema({"x-kubernetes-preserve-unknown-fields": True})


# --- the built-in kinds' schemas --------------------------------------------------------


@functools.cache
def _definitions() -> dict[str, Any]:
    import kubernetes_validate

    root = pathlib.Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    path = root / f"v{KUBERNETES_VERSION}-local" / "_definitions.json"
    return json.loads(path.read_text())["$defs"]


@functools.cache
def _by_gvk() -> dict[tuple[str, str, str], str]:
    found: dict[tuple[str, str, str], str] = {}
    for name, node in _definitions().items():
        for gvk in node.get("x-kubernetes-group-version-kind") or []:
            found[(gvk.get("group", ""), gvk["version"], gvk["kind"])] = name
    return found


def builtin_schema(group: str, version: str, kind: str) -> Schema:
    """The schema of a built-in kind, e.g. ``("apps", "v1", "StatefulSet")``."""
    defs = _definitions()
    return Schema(defs[_by_gvk()[(group, version, kind)]], defs)
