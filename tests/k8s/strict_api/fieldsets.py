"""Sets of field paths, as server-side apply tracks them in ``metadata.managedFields``
(the ``FieldsV1`` format: ``f:<field>``, ``k:<key json>`` for an item of a map list,
``v:<value json>`` for an item of a set list, ``.`` for the item itself).

A path is a tuple of elements ``("f", name)``, ``("k", key json)`` or ``("v", value
json)``. A set holds the leaves an object sets: scalars, atomic lists and maps, empty
objects, and the items of associative lists (the key and its other fields follow as
their own paths). Which lists are associative comes from the kind's schema
(``x-kubernetes-list-type``/``-list-map-keys``): for built-in kinds that is their
OpenAPI document, so containers, volumes, env, volumeMounts (by mountPath), ports (by
containerPort and protocol; a Service's by port and protocol), imagePullSecrets,
ownerReferences (by uid) are keyed, finalizers a set, tolerations and envFrom atomic.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from .schema import ANY, Schema

Element = tuple[str, str]
Path = tuple[Element, ...]
FieldSet = set[Path]

MISSING: Any = object()

# Fields of metadata the server owns: never in a field set.
SERVER_METADATA = frozenset(
    {
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "managedFields",
        "selfLink",
        "generateName",
    }
)
# A key field an applied item may leave out: its default stands in (as SSA does).
KEY_DEFAULTS = {"protocol": "TCP"}


def _canonical(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def item_key(item: Any, keys: list[str]) -> str | None:
    if not isinstance(item, Mapping):
        return None
    return json.dumps(
        {k: item.get(k, KEY_DEFAULTS.get(k)) for k in keys if k in item or k in KEY_DEFAULTS},
        separators=(",", ":"),
    )


def _is_object(value: Any, schema: Schema) -> bool:
    return (
        isinstance(value, Mapping)
        and not schema.atomic_map
        and (not schema.types or "object" in schema.types)
    )


def field_set(value: Any, schema: Schema, prefix: Path = ()) -> FieldSet:
    """The leaves (and associative list items) ``value`` sets."""
    out: FieldSet = set()
    if _is_object(value, schema):
        if not value and prefix:
            out.add(prefix)
        for name, item in value.items():
            out |= field_set(item, schema.prop(name) or ANY, (*prefix, ("f", name)))
    elif isinstance(value, list) and schema.list_type in ("map", "set") and prefix:
        items = schema.items()
        for item in value:
            if schema.list_type == "map":
                key = item_key(item, schema.map_keys)
                if key is None:
                    out.add(prefix)
                    continue
                path = (*prefix, ("k", key))
                out.add(path)
                out |= field_set(item, items, path)
            else:
                out.add((*prefix, ("v", _canonical(item))))
    elif prefix:
        out.add(prefix)
    return out


def object_field_set(obj: Mapping[str, Any], schema: Schema, status: bool | None) -> FieldSet:
    """What an object's writer sets: no apiVersion, kind or server-owned metadata; with a
    status subresource, ``status`` only (``status=True``) or all but it (``False``)."""
    body: dict[str, Any] = {}
    for name, value in obj.items():
        if name in ("apiVersion", "kind"):
            continue
        if status is True and name != "status":
            continue
        if status is False and name == "status":
            continue
        if name == "metadata" and isinstance(value, Mapping):
            value = {k: v for k, v in value.items() if k not in SERVER_METADATA}
            if not value:
                continue
        body[name] = value
    return field_set(body, schema)


def value_at(obj: Any, path: Path, schema: Schema) -> Any:
    """The value a path names in ``obj`` (MISSING if none)."""
    node = obj
    for kind, name in path:
        if kind == "f":
            if not isinstance(node, Mapping) or name not in node:
                return MISSING
            schema = schema.prop(name) or ANY
            node = node[name]
        elif kind == "k":
            if not isinstance(node, list):
                return MISSING
            keys = schema.map_keys
            schema = schema.items()
            node = next((i for i in node if item_key(i, keys) == name), MISSING)
            if node is MISSING:
                return MISSING
        else:  # "v": a set's item
            if not isinstance(node, list):
                return MISSING
            wanted = json.loads(name)
            return wanted if wanted in node else MISSING
    return node


def remove_path(obj: Any, path: Path, schema: Schema) -> None:
    """Remove what ``path`` names from ``obj`` (in place), if it is there."""
    if not path:
        return
    parent = value_at(obj, path[:-1], schema) if len(path) > 1 else obj
    parent_schema = schema
    for kind, name in path[:-1]:
        parent_schema = (parent_schema.prop(name) or ANY) if kind == "f" else parent_schema.items()
    kind, name = path[-1]
    if kind == "f" and isinstance(parent, dict):
        parent.pop(name, None)
    elif kind == "k" and isinstance(parent, list):
        keys = parent_schema.map_keys
        parent[:] = [i for i in parent if item_key(i, keys) != name]
    elif kind == "v" and isinstance(parent, list):
        wanted = json.loads(name)
        parent[:] = [i for i in parent if i != wanted]


def is_prefix(short: Path, long: Path) -> bool:
    return len(short) <= len(long) and long[: len(short)] == short


def describe(path: Path) -> str:
    """A path as conflict messages print it: ``.spec.containers[name="storage"].image``."""
    out = ""
    for kind, name in path:
        if kind == "f":
            out += f".{name}"
        elif kind == "k":
            key = json.loads(name)
            out += "[" + ",".join(f"{k}={json.dumps(v)}" for k, v in key.items()) + "]"
        else:
            out += f"[{name}]"
    return out


# --- FieldsV1 ---------------------------------------------------------------------------


def to_fields_v1(paths: Iterable[Path]) -> dict[str, Any]:
    root: dict[str, Any] = {}
    ordered = sorted(paths)
    for path in ordered:
        node = root
        for kind, name in path:
            node = node.setdefault(f"{kind}:{name}", {})
    # An item (or empty object) that is itself in the set and has children: ".".
    for path in ordered:
        node = root
        for kind, name in path:
            node = node[f"{kind}:{name}"]
        if node:
            node["."] = {}
    return root


def from_fields_v1(fields: Mapping[str, Any], prefix: Path = ()) -> FieldSet:
    out: FieldSet = set()
    for key, sub in fields.items():
        if key == ".":
            out.add(prefix)
            continue
        kind, _, name = key.partition(":")
        path = (*prefix, (kind, name))
        if sub:
            out |= from_fields_v1(sub, path)
        else:
            out.add(path)
    return out
