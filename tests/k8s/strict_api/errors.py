"""The API server's errors: an exception that becomes a ``kind: Status`` body, and field
errors phrased as kube-apiserver phrases them (k8s.io/apimachinery's field.Error).

The messages matter: operators log them, and tests match them against what a real
cluster would answer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


class ApiError(Exception):
    """An error answer: HTTP ``code`` with a Status body (``reason``, ``message``)."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


def _details(name: str | None, group: str, plural: str, **more: Any) -> dict[str, Any]:
    details: dict[str, Any] = {"kind": plural, **more}
    if name is not None:
        details["name"] = name
    if group:
        details["group"] = group
    return details


def group_resource(group: str, plural: str) -> str:
    """``statefulsets.apps``, ``pods``: how messages name a resource."""
    return f"{plural}.{group}" if group else plural


def group_kind(group: str, kind: str) -> str:
    """``StatefulSet.apps``, ``Service``: how an Invalid message names a kind."""
    return f"{kind}.{group}" if group else kind


def not_found(group: str, plural: str, name: str) -> ApiError:
    return ApiError(
        404,
        "NotFound",
        f'{group_resource(group, plural)} "{name}" not found',
        _details(name, group, plural),
    )


def already_exists(group: str, plural: str, name: str) -> ApiError:
    return ApiError(
        409,
        "AlreadyExists",
        f'{group_resource(group, plural)} "{name}" already exists',
        _details(name, group, plural),
    )


def conflict(group: str, plural: str, name: str, why: str | None = None) -> ApiError:
    why = why or (
        "the object has been modified; please apply your changes to the latest version "
        "and try again"
    )
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {group_resource(group, plural)} "{name}": {why}',
        _details(name, group, plural),
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def forbidden(group: str, plural: str, name: str, why: str) -> ApiError:
    return ApiError(
        403,
        "Forbidden",
        f'{group_resource(group, plural)} "{name}" is forbidden: {why}',
        _details(name, group, plural),
    )


def unauthorized() -> ApiError:
    return ApiError(401, "Unauthorized", "Unauthorized")


def expired(message: str) -> ApiError:
    # kube-apiserver answers a too old resourceVersion with 410 and reason Expired
    # (StatusReasonGone is the same code; clients look at the code).
    return ApiError(410, "Expired", message)


def method_not_allowed(message: str) -> ApiError:
    return ApiError(405, "MethodNotAllowed", message)


def unsupported_media_type(content_type: str, accepted: list[str]) -> ApiError:
    return ApiError(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format - accepted media types include: "
        f"{', '.join(accepted)}",
    )


def unprocessable(detail: str) -> ApiError:
    """A JSON patch that cannot be applied (a failed ``test``, a missing path): 422, as
    kube-apiserver's NewGenericServerResponse gives it."""
    return ApiError(
        422,
        "Invalid",
        f"the server rejected our request due to an error in our request ({detail})",
    )


# --- field errors -----------------------------------------------------------------------

_REASONS = {
    "Required": "FieldValueRequired",
    "Invalid": "FieldValueInvalid",
    "TypeInvalid": "FieldValueTypeInvalid",
    "NotSupported": "FieldValueNotSupported",
    "Forbidden": "FieldValueForbidden",
    "TooLong": "FieldValueTooLong",
    "TooMany": "FieldValueTooMany",
    "Duplicate": "FieldValueDuplicate",
    "NotFound": "FieldValueNotFound",
}

_OMIT = object()


def show(value: Any) -> str:
    """A value as field errors print it: strings quoted, objects by their type name."""
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return json.dumps(value)
    if isinstance(value, dict):
        return '"object"'
    if isinstance(value, list):
        return '"array"'
    return json.dumps(str(value))


@dataclass
class FieldError:
    kind: str  # a key of _REASONS
    path: str  # spec.storage.replicas
    detail: str = ""
    value: Any = field(default=_OMIT)

    @property
    def reason(self) -> str:
        return _REASONS[self.kind]

    def body(self) -> str:
        """What follows ``<path>: `` in the message."""
        if self.kind == "Required":
            return "Required value" + (f": {self.detail}" if self.detail else "")
        if self.kind == "Forbidden":
            return "Forbidden" + (f": {self.detail}" if self.detail else "")
        if self.kind == "TooLong":
            return f"Too long: {self.detail}"
        if self.kind == "TooMany":
            return f"Too many: {self.detail}"
        if self.kind == "NotFound":
            return f"Not found: {show(self.value)}"
        if self.kind == "Duplicate":
            return f"Duplicate value: {show(self.value)}"
        if self.kind == "NotSupported":
            return f"Unsupported value: {show(self.value)}: {self.detail}"
        prefix = "Invalid value"
        if self.value is not _OMIT:
            prefix += f": {show(self.value)}"
        return prefix + (f": {self.detail}" if self.detail else "")

    def __str__(self) -> str:
        return f"{self.path}: {self.body()}" if self.path else self.body()


def invalid(group: str, kind: str, plural: str, name: str, errors: list[FieldError]) -> ApiError:
    """422 Invalid, ``<Kind>.<group> "<name>" is invalid: <error>`` (several: ``[e1, e2]``)."""
    texts = [str(e) for e in errors]
    joined = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    return ApiError(
        422,
        "Invalid",
        f'{group_kind(group, kind)} "{name}" is invalid: {joined}',
        _details(
            name,
            group,
            kind,
            causes=[{"reason": e.reason, "message": e.body(), "field": e.path} for e in errors],
        ),
    )


def json_type(value: Any) -> str:
    """The JSON type of a decoded value, as field errors name it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"
