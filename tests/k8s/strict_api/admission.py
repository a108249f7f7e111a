"""Everything a create or an update goes through before it is stored, in kube-apiserver's
order: decoding (a built-in kind's field of the wrong type is a 400, as the Go decoder
answers), pruning of unknown fields (dropped with a warning; a 400 under
``fieldValidation=Strict``), defaulting (a CRD's schema defaults; the built-in kinds'
Go defaults), then validation (metadata, the schema, CEL rules, the kinds' rules) as
one 422 listing every error."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from . import builtins
from .errors import FieldError, bad_request, invalid
from .names import validate_metadata
from .registry import ResourceType
from .validation import MISSING, apply_defaults, prune, validate


def _decode_problem(error: FieldError) -> bool:
    """What the Go decoder refuses before any validation: a value of the wrong type, a
    Secret's data that is not base64, a timestamp that is not RFC 3339."""
    return error.kind == "TypeInvalid" or any(
        f"must be of type {t}" in error.detail for t in ("byte", "date-time")
    )


def admit(
    rt: ResourceType,
    obj: dict[str, Any],
    old: Mapping[str, Any] | None,
    *,
    strict_fields: bool,
    cluster_ips: builtins.ClusterIPs,
    expandable: Callable[[str | None], bool],
) -> tuple[dict[str, Any], list[str]]:
    """The object as it will be stored, and the warnings (unknown fields dropped);
    raises ApiError (400, 403, 422) when it may not be."""
    warnings: list[str] = []
    meta = obj.get("metadata") or {}
    # The server's own bookkeeping: not the request's to shape, so not pruned.
    managed = meta.pop("managedFields", None)
    if rt.schema is not None:
        unknown: list[str] = []
        obj = prune(obj, rt.schema, "", unknown)
        if unknown and strict_fields:
            raise bad_request(
                "strict decoding error: " + ", ".join(f'unknown field "{u}"' for u in unknown)
            )
        warnings += [f'unknown field "{u}"' for u in unknown]
    if rt.custom and rt.schema is not None:
        obj = apply_defaults(obj, rt.schema)
    elif rt.schema is not None and not rt.custom:
        decode: list[FieldError] = []
        validate(obj, rt.schema, "", decode, run_cel=False, crd=False)
        problems = [e for e in decode if _decode_problem(e)]
        if problems:
            raise builtins.decode_error(rt.kind, rt.version, "; ".join(str(p) for p in problems))
    if not rt.custom:
        builtins.apply_defaults(rt.kind, obj, old, cluster_ips)

    errors: list[FieldError] = validate_metadata(obj.get("metadata") or {}, rt.kind, rt.namespaced)
    if rt.schema is not None:
        schema_errors: list[FieldError] = []
        old_value = old if old is not None else MISSING
        validate(
            obj,
            rt.schema,
            "",
            schema_errors,
            old=old_value,
            run_cel=rt.custom,
            crd=rt.custom,
        )
        errors += [
            e
            for e in schema_errors
            if not e.path.startswith("metadata") and not (not rt.custom and _decode_problem(e))
        ]
    if not rt.custom:
        errors += builtins.validate(rt.kind, obj, old)
    if managed is not None:
        obj["metadata"]["managedFields"] = managed
    if errors:
        raise invalid(
            rt.group, rt.kind, rt.plural, meta.get("name") or meta.get("generateName", ""), errors
        )
    if rt.kind == "PersistentVolumeClaim" and old is not None:
        builtins.check_resize(obj, old, expandable)
    return obj, warnings
