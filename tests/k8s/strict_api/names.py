"""Object metadata every kind shares: names (DNS subdomain, DNS label, DNS-1035 label),
label keys and values, annotations, owner references and finalizers, checked with
kube-apiserver's messages (k8s.io/apimachinery/pkg/util/validation)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .errors import FieldError

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_LABEL = re.compile(f"^{_LABEL}$")
_DNS1123_SUBDOMAIN = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
    "'-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', "
    "regex used for validation is "
    "'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
LABEL_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', "
    "regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
DNS1035_MESSAGE = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with "
    "an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or "
    "'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
)
QUALIFIED_NAME_MESSAGE = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and "
    "end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex "
    "used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
LABEL_VALUE_MESSAGE = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' "
    "or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
    "'my_value',  or '12345', regex used for validation is "
    "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)

# How each kind's names are checked (the rest: DNS subdomain).
NAME_RULES = {
    "Namespace": "label",
    "Service": "dns1035",
    "StatefulSet": "label",  # its pods' hostnames are <name>-<ordinal>
}


def name_problems(name: str, rule: str) -> list[str]:
    """Why ``name`` is not a valid name under ``rule`` (subdomain, label, dns1035)."""
    problems: list[str] = []
    if rule == "subdomain":
        if len(name) > 253:
            problems.append("must be no more than 253 characters")
        if not _DNS1123_SUBDOMAIN.match(name):
            problems.append(SUBDOMAIN_MESSAGE)
    else:
        if len(name) > 63:
            problems.append("must be no more than 63 characters")
        pattern, message = (
            (_DNS1123_LABEL, LABEL_MESSAGE)
            if rule == "label"
            else (_DNS1035_LABEL, DNS1035_MESSAGE)
        )
        if not pattern.match(name):
            problems.append(message)
    return problems


def qualified_name_problems(key: str) -> list[str]:
    """A label or annotation key: ``[prefix/]name``."""
    problems: list[str] = []
    prefix, slash, name = key.rpartition("/")
    if slash and not prefix:
        return ["prefix part must be non-empty"]
    if prefix:
        problems += ["prefix part " + p for p in name_problems(prefix, "subdomain")]
    if not name:
        problems.append("name part must be non-empty")
    elif len(name) > 63:
        problems.append("name part must be no more than 63 characters")
    elif not _QUALIFIED_NAME.match(name):
        problems.append(QUALIFIED_NAME_MESSAGE)
    return problems


def label_value_problems(value: str) -> list[str]:
    problems: list[str] = []
    if len(value) > 63:
        problems.append("must be no more than 63 characters")
    if not _LABEL_VALUE.match(value):
        problems.append(LABEL_VALUE_MESSAGE)
    return problems


def validate_labels(labels: Any, path: str) -> list[FieldError]:
    errors: list[FieldError] = []
    if not isinstance(labels, Mapping):
        return errors
    for key, value in labels.items():
        for problem in qualified_name_problems(str(key)):
            errors.append(FieldError("Invalid", path, problem, key))
        if not isinstance(value, str):
            errors.append(FieldError("Invalid", path, "label values must be strings", value))
            continue
        for problem in label_value_problems(value):
            errors.append(FieldError("Invalid", path, problem, value))
    return errors


_ANNOTATIONS_LIMIT = 256 * 1024


def validate_metadata(meta: Mapping[str, Any], kind: str, namespaced: bool) -> list[FieldError]:
    """The ObjectMeta checks of every create and update."""
    errors: list[FieldError] = []
    name = meta.get("name")
    if not name:
        errors.append(FieldError("Required", "metadata.name", "name or generateName is required"))
    else:
        for problem in name_problems(name, NAME_RULES.get(kind, "subdomain")):
            errors.append(FieldError("Invalid", "metadata.name", problem, name))
    if namespaced and not meta.get("namespace"):
        errors.append(FieldError("Required", "metadata.namespace"))
    if not namespaced and meta.get("namespace"):
        errors.append(FieldError("Forbidden", "metadata.namespace", "not allowed on this type"))
    errors += validate_labels(meta.get("labels"), "metadata.labels")
    annotations = meta.get("annotations") or {}
    if isinstance(annotations, Mapping):
        for key in annotations:
            for problem in qualified_name_problems(str(key).lower()):
                errors.append(FieldError("Invalid", "metadata.annotations", problem, key))
        size = sum(len(k) + len(str(v)) for k, v in annotations.items())
        if size > _ANNOTATIONS_LIMIT:
            errors.append(
                FieldError(
                    "TooLong",
                    "metadata.annotations",
                    f"must have at most {_ANNOTATIONS_LIMIT} bytes",
                )
            )
    controllers = 0
    for i, ref in enumerate(meta.get("ownerReferences") or []):
        path = f"metadata.ownerReferences[{i}]"
        for key in ("apiVersion", "kind", "name", "uid"):
            if not ref.get(key):
                what = "version" if key == "apiVersion" else key
                errors.append(
                    FieldError(
                        "Invalid", f"{path}.{key}", f"{what} must not be empty", ref.get(key, "")
                    )
                )
        controllers += 1 if ref.get("controller") else 0
    if controllers > 1:
        errors.append(
            FieldError(
                "Invalid",
                "metadata.ownerReferences",
                "Only one reference can have Controller set to true.",
                meta.get("ownerReferences"),
            )
        )
    for i, finalizer in enumerate(meta.get("finalizers") or []):
        for problem in qualified_name_problems(finalizer):
            errors.append(FieldError("Invalid", f"metadata.finalizers[{i}]", problem, finalizer))
    return errors
