"""Structural schema processing, in kube-apiserver's order: prune unknown fields, apply
defaults, validate (types, required, enum, pattern, bounds, list uniqueness) and run the
CEL rules, correlating the old object's values for transition rules.

Messages follow k8s.io/kube-openapi's validation errors as apiextensions-apiserver
reports them (``spec.partitions: Invalid value: 0: spec.partitions in body should be
greater than or equal to 1``).
"""

from __future__ import annotations

import base64
import binascii
import copy
import datetime
import json
import re
from collections.abc import Mapping
from typing import Any

from .cel import evaluate_rules
from .errors import FieldError, json_type
from .schema import Schema

MISSING: Any = object()


def child_path(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


# --- pruning ----------------------------------------------------------------------------


def prune(value: Any, schema: Schema, path: str, unknown: list[str]) -> Any:
    """``value`` without the fields its schema does not know (recorded in ``unknown``);
    ``x-kubernetes-preserve-unknown-fields`` keeps them."""
    if isinstance(value, dict):
        if schema.embedded_resource:
            value = {
                k: v for k, v in value.items() if k not in ("apiVersion", "kind", "metadata")
            } | {k: value[k] for k in ("apiVersion", "kind", "metadata") if k in value}
        out: dict[str, Any] = {}
        for name, item in value.items():
            if schema.embedded_resource and name in ("apiVersion", "kind", "metadata"):
                out[name] = item
                continue
            sub = schema.prop(name)
            if sub is None:
                unknown.append(child_path(path, name))
                continue
            out[name] = prune(item, sub, child_path(path, name), unknown)
        return out
    if isinstance(value, list):
        items = schema.items()
        return [prune(item, items, f"{path}[{i}]", unknown) for i, item in enumerate(value)]
    return value


# --- defaulting -------------------------------------------------------------------------


def apply_defaults(value: Any, schema: Schema) -> Any:
    """Schema defaults filled in where a field is missing (and nulls dropped where the
    schema does not allow them), recursively, into defaulted values too."""
    if isinstance(value, dict):
        for name, node in schema.properties.items():
            sub = schema.child(node)
            if name in value and value[name] is None and not sub.nullable:
                del value[name]
            if name not in value and "default" in sub.node:
                value[name] = copy.deepcopy(sub.node["default"])
            if name in value:
                value[name] = apply_defaults(value[name], sub)
        extra = schema.node.get("additionalProperties")
        if isinstance(extra, Mapping):
            sub = schema.child(extra)
            for name in list(value):
                if name not in schema.properties:
                    value[name] = apply_defaults(value[name], sub)
    elif isinstance(value, list):
        items = schema.items()
        return [apply_defaults(item, items) for item in value]
    return value


# --- validation -------------------------------------------------------------------------


def _type_ok(value: Any, wanted: str) -> bool:
    actual = json_type(value)
    if wanted == "number":
        return actual in ("integer", "number")
    return actual == wanted


def _list_key(item: Any, keys: list[str]) -> tuple[Any, ...] | None:
    if not isinstance(item, Mapping):
        return None
    return tuple(json.dumps(item.get(k), sort_keys=True) for k in keys)


def _correlate_list(old: Any, schema: Schema) -> dict[tuple[Any, ...], Any]:
    """The old list's items by their keys (map lists only: the others do not correlate)."""
    if schema.list_type != "map" or not isinstance(old, list) or not schema.map_keys:
        return {}
    found: dict[tuple[Any, ...], Any] = {}
    for item in old:
        key = _list_key(item, schema.map_keys)
        if key is not None:
            found[key] = item
    return found


_DATE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


def _format_ok(value: Any, fmt: str) -> bool:
    if not isinstance(value, str):
        return True
    if fmt == "date-time":
        if not _DATE_TIME.match(value):
            return False
        try:
            datetime.datetime.fromisoformat(value.replace("z", "Z").replace("Z", "+00:00"))
        except ValueError:
            return False
    if fmt == "byte":
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            return False
    return True


def validate(
    value: Any,
    schema: Schema,
    path: str,
    errors: list[FieldError],
    old: Any = MISSING,
    run_cel: bool = True,
    crd: bool = True,
) -> None:
    """Append the errors of ``value`` against ``schema`` (``old``: the old object's
    correlated value, MISSING on create or where nothing correlates). ``crd``: a CRD's
    structural schema, whose required fields and list keys are rules; a built-in kind's
    OpenAPI document lists as required fields the Go decoder zero-fills, and map lists
    the Go validation lets hold duplicates (env), so there only its Go rules count."""
    node = schema.node
    where = path or "<root>"
    if value is None:
        if not schema.nullable and schema.types:
            wanted = sorted(schema.types)[0]
            errors.append(
                FieldError(
                    "TypeInvalid", path, f'{where} in body must be of type {wanted}: "null"', "null"
                )
            )
        return
    if schema.types and not any(_type_ok(value, t) for t in schema.types):
        wanted = "/".join(sorted(schema.types))
        actual = json_type(value)
        errors.append(
            FieldError(
                "TypeInvalid",
                path,
                f'{where} in body must be of type {wanted}: "{actual}"',
                actual,
            )
        )
        return
    if "enum" in node and value not in node["enum"]:
        supported = ", ".join(json.dumps(v) for v in node["enum"] if v is not None)
        errors.append(FieldError("NotSupported", path, f"supported values: {supported}", value))
    if isinstance(value, bool):
        pass
    elif isinstance(value, int | float):
        _validate_number(value, node, path, where, errors)
    elif isinstance(value, str):
        _validate_string(value, node, path, where, errors)
    if "format" in node and not _format_ok(value, node["format"]):
        errors.append(
            FieldError(
                "Invalid",
                path,
                f"{where} in body must be of type {node['format']}: {json.dumps(value)}",
                value,
            )
        )

    if isinstance(value, dict):
        for name in schema.required if crd else ():
            if name not in value:
                errors.append(FieldError("Required", child_path(path, name)))
        count = len(value)
        if "maxProperties" in node and count > node["maxProperties"]:
            errors.append(
                FieldError(
                    "TooMany", path, f"{count}: must have at most {node['maxProperties']} items"
                )
            )
        if "minProperties" in node and count < node["minProperties"]:
            errors.append(
                FieldError(
                    "Invalid",
                    path,
                    f"{where} in body should have at least {node['minProperties']} properties",
                    count,
                )
            )
        old_map = old if isinstance(old, Mapping) else {}
        for name, item in value.items():
            sub = schema.prop(name)
            if sub is None:
                continue
            if schema.embedded_resource and name == "metadata":
                continue
            validate(
                item,
                sub,
                child_path(path, name),
                errors,
                old_map.get(name, MISSING),
                run_cel,
                crd,
            )
    elif isinstance(value, list):
        count = len(value)
        if "maxItems" in node and count > node["maxItems"]:
            errors.append(
                FieldError("TooMany", path, f"{count}: must have at most {node['maxItems']} items")
            )
        if "minItems" in node and count < node["minItems"]:
            errors.append(
                FieldError(
                    "Invalid",
                    path,
                    f"{where} in body should have at least {node['minItems']} items",
                    count,
                )
            )
        if crd:
            _validate_uniqueness(value, schema, path, errors)
        items = schema.items()
        old_items = _correlate_list(old, schema)
        for i, item in enumerate(value):
            key = _list_key(item, schema.map_keys) if old_items else None
            validate(
                item,
                items,
                f"{path}[{i}]",
                errors,
                old_items.get(key, MISSING) if key is not None else MISSING,
                run_cel,
                crd,
            )

    rules = node.get("x-kubernetes-validations")
    if rules and run_cel:
        errors.extend(evaluate_rules(rules, value, old, old is not MISSING, path))


def _validate_number(
    value: float, node: Mapping[str, Any], path: str, where: str, errors: list[FieldError]
) -> None:
    if "minimum" in node:
        low = node["minimum"]
        if node.get("exclusiveMinimum") and value <= low:
            errors.append(
                FieldError("Invalid", path, f"{where} in body should be greater than {low}", value)
            )
        elif value < low:
            errors.append(
                FieldError(
                    "Invalid",
                    path,
                    f"{where} in body should be greater than or equal to {low}",
                    value,
                )
            )
    if "maximum" in node:
        high = node["maximum"]
        if node.get("exclusiveMaximum") and value >= high:
            errors.append(
                FieldError("Invalid", path, f"{where} in body should be less than {high}", value)
            )
        elif value > high:
            errors.append(
                FieldError(
                    "Invalid",
                    path,
                    f"{where} in body should be less than or equal to {high}",
                    value,
                )
            )
    if "multipleOf" in node and value % node["multipleOf"]:
        errors.append(
            FieldError(
                "Invalid",
                path,
                f"{where} in body should be a multiple of {node['multipleOf']}",
                value,
            )
        )


def _validate_string(
    value: str, node: Mapping[str, Any], path: str, where: str, errors: list[FieldError]
) -> None:
    if "maxLength" in node and len(value) > node["maxLength"]:
        unit = "byte" if node["maxLength"] == 1 else "bytes"
        errors.append(
            FieldError("TooLong", path, f"may not be more than {node['maxLength']} {unit}", value)
        )
    if "minLength" in node and len(value) < node["minLength"]:
        errors.append(
            FieldError(
                "Invalid",
                path,
                f"{where} in body should be at least {node['minLength']} chars long",
                value,
            )
        )
    if "pattern" in node and not re.search(node["pattern"], value):
        errors.append(
            FieldError("Invalid", path, f"{where} in body should match '{node['pattern']}'", value)
        )


def _validate_uniqueness(
    value: list[Any], schema: Schema, path: str, errors: list[FieldError]
) -> None:
    list_type = schema.node.get("x-kubernetes-list-type")
    if list_type == "set" or schema.node.get("uniqueItems"):
        seen: list[Any] = []
        for i, item in enumerate(value):
            if item in seen:
                errors.append(FieldError("Duplicate", f"{path}[{i}]", value=item))
            seen.append(item)
    elif list_type == "map":
        keys = schema.map_keys
        seen_keys: set[tuple[Any, ...]] = set()
        for i, item in enumerate(value):
            key = _list_key(item, keys)
            if key is None:
                continue
            if key in seen_keys:
                shown = {k: item.get(k) for k in keys}
                errors.append(FieldError("Duplicate", f"{path}[{i}]", value=shown))
            seen_keys.add(key)
