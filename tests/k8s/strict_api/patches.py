"""The three patch formats besides apply: JSON merge patch (RFC 7386), JSON patch (RFC
6902, with ``test``: kopf guards its finalizer patches with a test of the
resourceVersion) and strategic merge patch (built-in kinds only: lists merge by their
patch merge key, as the kinds' OpenAPI schemas declare)."""

from __future__ import annotations

import copy
import json
from typing import Any

from .errors import ApiError, bad_request, unprocessable
from .schema import Schema


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# --- JSON patch -------------------------------------------------------------------------


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise unprocessable(f'path "{path}" must start with "/"')
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str], path: str) -> tuple[Any, str]:
    node = doc
    for part in parts[:-1]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise unprocessable(f"doc is missing path: {path}: missing value")
    return node, parts[-1]


def _get(doc: Any, path: str) -> Any:
    node = doc
    for part in _pointer(path):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise unprocessable(f"doc is missing path: {path}: missing value")
    return node


def _add(doc: Any, path: str, value: Any) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent, last = _parent(doc, parts, path)
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent):
            parent.insert(int(last), value)
        else:
            raise unprocessable(f"add operation does not apply: doc is missing path: {path}")
    else:
        raise unprocessable(f"doc is missing path: {path}: missing value")
    return doc


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        raise unprocessable("unable to remove the root")
    parent, last = _parent(doc, parts, path)
    if isinstance(parent, dict) and last in parent:
        del parent[last]
    elif isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        del parent[int(last)]
    else:
        raise unprocessable(
            f"unable to remove nonexistent key: {last}: missing value"
            if isinstance(parent, dict)
            else f"remove operation does not apply: doc is missing path: {path}: missing value"
        )
    return doc


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902. A malformed patch is a 400; one that does not apply (a failed ``test``,
    a missing path) a 422, as kube-apiserver answers them."""
    if not isinstance(operations, list):
        raise bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise bad_request(f"invalid JSON patch operation: {json.dumps(op)}")
        kind, path = op["op"], op["path"]
        if kind in ("add", "replace", "test") and "value" not in op:
            raise bad_request(f"{kind} operation needs a value: {json.dumps(op)}")
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op["value"]))
        elif kind == "remove":
            doc = _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)  # must exist
            doc = _remove(doc, path) if _pointer(path) else doc
            doc = _add(doc, path, copy.deepcopy(op["value"]))
        elif kind == "move":
            value = _get(doc, op["from"])
            doc = _remove(doc, op["from"])
            doc = _add(doc, path, value)
        elif kind == "copy":
            doc = _add(doc, path, copy.deepcopy(_get(doc, op["from"])))
        elif kind == "test":
            try:
                actual = _get(doc, path)
            except ApiError:
                actual = None
            if actual != op["value"]:
                raise unprocessable(f"testing value {path} failed: test failed")
        else:
            raise bad_request(f"Unexpected kind: {kind}")
    return doc


# --- strategic merge patch --------------------------------------------------------------


def strategic_merge_patch(target: Any, patch: Any, schema: Schema) -> Any:
    """Merge patch where lists with a patch merge key merge item by item (and lists of
    scalars with a merge strategy, such as finalizers, are unions); ``$patch: delete``
    and ``$patch: replace`` are honoured, ``$setElementOrder``/``$retainKeys`` dropped."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key in ("$retainKeys", "$patch"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            result[field] = [v for v in result.get(field) or [] if v not in value]
            continue
        sub = schema.prop(key) or schema
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and sub.patch_merge_key is not None:
            result[key] = _merge_list(result.get(key) or [], value, sub)
        elif isinstance(value, dict):
            merged = strategic_merge_patch(result.get(key), value, sub)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        else:
            result[key] = copy.deepcopy(value)
    return result


def _merge_list(current: list[Any], patch: list[Any], schema: Schema) -> list[Any]:
    key = schema.patch_merge_key
    if not key:  # a list of scalars: union, in order
        return list(current) + [v for v in patch if v not in current]
    result = copy.deepcopy(current)
    items = schema.items()
    for item in patch:
        if not isinstance(item, dict):
            raise bad_request(f"map: {item!r} does not contain declared merge key: {key}")
        if item.get("$patch") == "replace":
            return [copy.deepcopy({k: v for k, v in i.items() if k != "$patch"}) for i in patch]
        if key not in item:
            raise bad_request(f"map: {item!r} does not contain declared merge key: {key}")
        found = next((i for i, r in enumerate(result) if r.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if found is not None:
                del result[found]
            continue
        if found is None:
            result.append(strategic_merge_patch({}, item, items))
        else:
            result[found] = strategic_merge_patch(result[found], item, items)
    return result
