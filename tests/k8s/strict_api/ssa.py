"""Field ownership and server-side apply (``application/apply-patch+yaml``).

Every write records who set which fields in ``metadata.managedFields``: an Update
(PUT, PATCH) makes its manager own the fields it added or changed and takes them from
the others; an Apply makes its manager own exactly the fields of its configuration.
An apply that would change a field another manager owns is a 409 Conflict naming the
field and the manager, unless ``force``, which takes the field over. Fields the
applier owned before and leaves out now are removed unless another manager owns them.

Simplifications, knowingly: an applied configuration is merged without the kind's
defaults (the key of a port defaults its protocol to TCP, as SSA does); conflicts are
found per path (a manager owning a field inside an item the applier sets atomically is
not a conflict); ``managedFields`` sent in a request body are ignored.
"""

from __future__ import annotations

import copy
import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import ApiError
from .fieldsets import (
    MISSING,
    FieldSet,
    Path,
    describe,
    from_fields_v1,
    is_prefix,
    item_key,
    object_field_set,
    remove_path,
    to_fields_v1,
    value_at,
)
from .schema import ANY, Schema


@dataclass
class Manager:
    name: str
    operation: str  # Apply | Update
    api_version: str
    time: str
    fields: FieldSet = field(default_factory=set)
    subresource: str = ""

    @property
    def identity(self) -> tuple[str, str, str]:
        return (self.name, self.operation, self.subresource)

    def entry(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "manager": self.name,
            "operation": self.operation,
            "apiVersion": self.api_version,
            "time": self.time,
            "fieldsType": "FieldsV1",
            "fieldsV1": to_fields_v1(self.fields),
        }
        if self.subresource:
            out["subresource"] = self.subresource
        return out

    def shown(self) -> str:
        """As a conflict message names it."""
        text = f'"{self.name}"'
        if self.subresource:
            text += f' with subresource "{self.subresource}"'
        if self.operation == "Update":
            text += f" using {self.api_version}"
        return text


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def read_managers(obj: Mapping[str, Any]) -> list[Manager]:
    out = []
    for entry in (obj.get("metadata") or {}).get("managedFields") or []:
        out.append(
            Manager(
                name=entry.get("manager", ""),
                operation=entry.get("operation", "Update"),
                api_version=entry.get("apiVersion", ""),
                time=entry.get("time", ""),
                fields=from_fields_v1(entry.get("fieldsV1") or {}),
                subresource=entry.get("subresource", ""),
            )
        )
    return out


def write_managers(obj: dict[str, Any], managers: list[Manager]) -> None:
    kept = [m.entry() for m in managers if m.fields]
    if kept:
        obj.setdefault("metadata", {})["managedFields"] = kept
    else:
        obj.get("metadata", {}).pop("managedFields", None)


def _scope(subresource: str, has_status: bool) -> bool | None:
    """Which part of the object a write of this subresource may own."""
    if subresource == "status":
        return True
    return False if has_status else None


def track_update(
    old: Mapping[str, Any] | None,
    new: dict[str, Any],
    schema: Schema,
    manager: str,
    subresource: str,
    has_status: bool,
) -> None:
    """Record an Update by ``manager`` that turned ``old`` into ``new`` (in place)."""
    scope = _scope(subresource, has_status)
    managers = read_managers(old) if old else []
    new_set = object_field_set(new, schema, scope)
    old_set = object_field_set(old, schema, scope) if old else set()
    removed = old_set - new_set
    changed: FieldSet = set()
    for path in new_set:
        # a leaf whose value changed, or anything new (an item counts only when added)
        if path not in old_set:
            changed.add(path)
            continue
        if path[-1][0] == "f" and value_at(old, path, schema) != value_at(new, path, schema):
            changed.add(path)
    # Whatever the whole object no longer has, nobody owns (any part of the object).
    gone = (
        object_field_set(old, schema, None) - object_field_set(new, schema, None) if old else set()
    )
    for m in managers:
        m.fields -= gone | removed
        m.fields -= changed
    if changed:
        mine = next(
            (m for m in managers if m.identity == (manager, "Update", _sub(subresource))), None
        )
        if mine is None:
            mine = Manager(
                manager, "Update", new.get("apiVersion", ""), now(), set(), _sub(subresource)
            )
            managers.append(mine)
        mine.fields |= changed
        mine.time = now()
    write_managers(new, managers)


def _sub(subresource: str) -> str:
    return "status" if subresource == "status" else ""


def _merge(live: Any, applied: Any, schema: Schema) -> Any:
    """The applied configuration merged into the live value."""
    if isinstance(live, Mapping) and isinstance(applied, Mapping) and not schema.atomic_map:
        out = dict(copy.deepcopy(live))
        for name, value in applied.items():
            sub = schema.prop(name) or ANY
            out[name] = _merge(live[name], value, sub) if name in live else copy.deepcopy(value)
        return out
    if isinstance(live, list) and isinstance(applied, list):
        if schema.list_type == "map" and schema.map_keys:
            keys = schema.map_keys
            items = schema.items()
            out_list = copy.deepcopy(live)
            for item in applied:
                key = item_key(item, keys)
                index = next((i for i, x in enumerate(out_list) if item_key(x, keys) == key), None)
                if index is None:
                    out_list.append(copy.deepcopy(item))
                else:
                    out_list[index] = _merge(out_list[index], item, items)
            return out_list
        if schema.list_type == "set":
            return copy.deepcopy(live) + [copy.deepcopy(v) for v in applied if v not in live]
    return copy.deepcopy(applied)


def _is_key_field(path: Path, schema: Schema) -> bool:
    """A key field of a map list's item (``name`` of a container)."""
    if len(path) < 2 or path[-1][0] != "f" or path[-2][0] != "k":
        return False
    list_schema = schema
    for kind, name in path[:-2]:
        list_schema = (list_schema.prop(name) or ANY) if kind == "f" else list_schema.items()
    return path[-1][1] in list_schema.map_keys


def conflict_error(group: str, conflicts: list[tuple[Manager, Path]]) -> ApiError:
    """409, as kube-apiserver words an apply conflict."""
    if len(conflicts) == 1:
        m, path = conflicts[0]
        message = f"Apply failed with 1 conflict: conflict with {m.shown()}: {describe(path)}"
    else:
        by_manager: dict[str, list[str]] = {}
        for m, path in conflicts:
            by_manager.setdefault(m.shown(), []).append(describe(path))
        lines = []
        for shown in sorted(by_manager):
            lines.append(f"conflicts with {shown}:")
            lines += [f"- {p}" for p in sorted(by_manager[shown])]
        message = f"Apply failed with {len(conflicts)} conflicts: " + "\n".join(lines)
    return ApiError(
        409,
        "Conflict",
        message,
        {
            "causes": [
                {
                    "reason": "FieldManagerConflict",
                    "message": f"conflict with {m.shown()}",
                    "field": describe(path),
                }
                for m, path in conflicts
            ]
        },
    )


def apply(
    live: Mapping[str, Any] | None,
    applied: Mapping[str, Any],
    schema: Schema,
    manager: str,
    force: bool,
    subresource: str,
    has_status: bool,
    group: str,
) -> dict[str, Any]:
    """The object after ``manager`` applied ``applied`` to ``live`` (None: it is
    created); 409 on a conflict without ``force``."""
    scope = _scope(subresource, has_status)
    base: dict[str, Any] = copy.deepcopy(dict(live)) if live else {}
    config = copy.deepcopy(dict(applied))
    # Only the part this endpoint writes: the rest of the configuration is ignored.
    if scope is False:
        config.pop("status", None)
    elif scope is True:
        config = {
            k: v for k, v in config.items() if k in ("apiVersion", "kind", "metadata", "status")
        }
        config["metadata"] = {
            k: v for k, v in (config.get("metadata") or {}).items() if k in ("name", "namespace")
        }
    config_meta = config.get("metadata") or {}
    config["metadata"] = {k: v for k, v in config_meta.items() if k != "managedFields"}
    if live:
        for key in ("resourceVersion",):  # a precondition, checked by the caller
            config["metadata"].pop(key, None)
    applied_set = object_field_set(config, schema, scope)
    managers = read_managers(base) if live else []
    identity = (manager, "Apply", _sub(subresource))
    mine = next((m for m in managers if m.identity == identity), None)
    previous = set(mine.fields) if mine else set()
    merged = _merge(base, config, schema)

    conflicts: list[tuple[Manager, Path]] = []
    for other in managers:
        if other.identity == identity:
            continue
        for path in sorted(applied_set & other.fields):
            if value_at(base, path, schema) != value_at(merged, path, schema):
                conflicts.append((other, path))
    if conflicts and not force:
        raise conflict_error(group, conflicts)
    for other, path in conflicts:
        other.fields.discard(path)

    others: FieldSet = set()
    for other in managers:
        if other.identity != identity:
            others |= other.fields
    removed: list[Path] = []
    for path in sorted(previous - applied_set, key=len):
        if any(is_prefix(r, path) for r in removed):
            continue  # went with what holds it
        if any(is_prefix(path, p) for p in applied_set):
            continue  # still applied, inside
        if any(is_prefix(p, path) and p[-1][0] == "f" for p in applied_set):
            continue  # inside a value applied whole now (an atomic list, a scalar)
        if any(is_prefix(path, p) for p in others):
            continue  # someone else still owns it (or something inside it)
        if _is_key_field(path, schema):
            continue  # an item that stays keeps its key
        if value_at(merged, path, schema) is not MISSING:
            remove_path(merged, path, schema)
            removed.append(path)

    if mine is None:
        mine = Manager(
            manager, "Apply", config.get("apiVersion", ""), now(), set(), _sub(subresource)
        )
        managers.append(mine)
    if mine.fields != applied_set:
        mine.fields = applied_set
        mine.time = now()
    mine.api_version = config.get("apiVersion", mine.api_version)
    write_managers(merged, managers)
    return merged
