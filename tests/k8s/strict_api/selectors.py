"""Label selectors (``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x)``, ``a``,
``!a``, ``a>1``, ``a<1``) and field selectors (``metadata.name``, ``metadata.namespace``
and each kind's few extra fields), parsed as k8s.io/apimachinery parses them: anything
else is a 400."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ApiError, bad_request
from .names import label_value_problems, qualified_name_problems


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # =, !=, in, notin, exists, !, >, <
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        has = self.key in labels
        value = labels.get(self.key)
        if self.op in ("=", "in"):
            return has and value in self.values
        if self.op in ("!=", "notin"):
            return not has or value not in self.values
        if self.op == "exists":
            return has
        if self.op == "!":
            return not has
        try:
            number, bound = int(value or ""), int(self.values[0])
        except ValueError:
            return False
        return number > bound if self.op == ">" else number < bound


_TOKEN = re.compile(r"\s*(==|!=|=|\(|\)|,|!|>|<|[^\s=!(),<>]+)")


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        match = _TOKEN.match(text, pos)
        if not match:
            raise bad_request(f"unable to parse requirement: unexpected {text[pos:]!r}")
        out.append(match.group(1))
        pos = match.end()
    return out


def _check_key(key: str, selector: str) -> None:
    problems = qualified_name_problems(key)
    if problems:
        raise bad_request(
            f'unable to parse requirement: key: Invalid value: "{key}": {problems[0]}'
        )


def _check_value(value: str) -> None:
    problems = label_value_problems(value)
    if problems:
        raise bad_request(
            f'unable to parse requirement: values[0]: Invalid value: "{value}": {problems[0]}'
        )


_WORD = re.compile(r"^[^\s=!(),<>]+$")


def parse_label_selector(text: str) -> list[Requirement]:
    """The requirements of a ``labelSelector`` (all must hold); 400 if it does not parse."""
    tokens = _tokens(text)
    requirements: list[Requirement] = []
    i = 0

    def fail(expected: str) -> ApiError:
        found = tokens[i] if i < len(tokens) else "end of string"
        return bad_request(f"unable to parse requirement: found '{found}', expected: {expected}")

    while i < len(tokens):
        if tokens[i] == "!":
            i += 1
            if i >= len(tokens) or not _WORD.match(tokens[i]):
                raise fail("identifier")
            _check_key(tokens[i], text)
            requirements.append(Requirement(tokens[i], "!"))
            i += 1
        else:
            if not _WORD.match(tokens[i]) or tokens[i] in ("in", "notin"):
                raise fail("!, identifier")
            key = tokens[i]
            _check_key(key, text)
            i += 1
            if i >= len(tokens) or tokens[i] == ",":
                requirements.append(Requirement(key, "exists"))
            elif tokens[i] in ("=", "==", "!="):
                op = "!=" if tokens[i] == "!=" else "="
                i += 1
                value = ""
                if i < len(tokens) and _WORD.match(tokens[i]):
                    value = tokens[i]
                    i += 1
                _check_value(value)
                requirements.append(Requirement(key, op, (value,)))
            elif tokens[i] in (">", "<"):
                op = tokens[i]
                i += 1
                if i >= len(tokens) or not re.match(r"^-?\d+$", tokens[i]):
                    raise fail("an integer")
                requirements.append(Requirement(key, op, (tokens[i],)))
                i += 1
            elif tokens[i] in ("in", "notin"):
                op = tokens[i]
                i += 1
                if i >= len(tokens) or tokens[i] != "(":
                    raise fail("(")
                i += 1
                values: list[str] = []
                while True:
                    if i < len(tokens) and _WORD.match(tokens[i]):
                        _check_value(tokens[i])
                        values.append(tokens[i])
                        i += 1
                    else:
                        values.append("")  # an empty value, as in "a in (,b)"
                    if i < len(tokens) and tokens[i] == ",":
                        i += 1
                        continue
                    if i < len(tokens) and tokens[i] == ")":
                        i += 1
                        break
                    raise fail(", or )")
                if op == "in" and values == [""]:
                    raise bad_request(
                        "unable to parse requirement: values: Invalid value: []string{}: "
                        "for 'in', 'notin' operators, values set can't be empty"
                    )
                requirements.append(Requirement(key, op, tuple(values)))
            else:
                raise fail("=, !=, ==, in, notin")
        if i < len(tokens):
            if tokens[i] != ",":
                raise fail(",")
            i += 1
            if i >= len(tokens):
                raise fail("!, identifier")
    return requirements


def matches_labels(requirements: list[Requirement], labels: Mapping[str, str] | None) -> bool:
    labels = labels or {}
    return all(r.matches(labels) for r in requirements)


def selector_from_match(selector: Mapping[str, Any] | None) -> Callable[[Mapping[str, str]], bool]:
    """A ``metav1.LabelSelector`` (matchLabels, matchExpressions) as a predicate; an empty
    selector matches everything, a missing one nothing."""
    if selector is None:
        return lambda labels: False
    requirements = [
        Requirement(k, "=", (v,)) for k, v in (selector.get("matchLabels") or {}).items()
    ]
    ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}
    for expression in selector.get("matchExpressions") or []:
        requirements.append(
            Requirement(
                expression["key"],
                ops[expression["operator"]],
                tuple(expression.get("values") or ()),
            )
        )
    return lambda labels: matches_labels(requirements, labels)


# --- field selectors --------------------------------------------------------------------

_COMMON_FIELDS = ("metadata.name", "metadata.namespace")
EXTRA_FIELDS: dict[str, tuple[str, ...]] = {
    "Event": (
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    ),
    "Pod": (
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    ),
    "Secret": ("type",),
    "Namespace": ("status.phase",),
    "Node": ("spec.unschedulable",),
}


@dataclass(frozen=True)
class FieldRequirement:
    field: str
    equal: bool
    value: str

    def matches(self, obj: Mapping[str, Any]) -> bool:
        actual = _field_value(obj, self.field)
        return (actual == self.value) == self.equal


def _field_value(obj: Mapping[str, Any], path: str) -> str:
    if path == "source":  # core/v1 Events: source.component
        path = "source.component"
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_field_selector(text: str, kind: str, is_custom: bool) -> list[FieldRequirement]:
    allowed = _COMMON_FIELDS + EXTRA_FIELDS.get(kind, ())
    requirements: list[FieldRequirement] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        match = re.match(r"^([^=!]+?)\s*(==|!=|=)\s*(.*)$", part)
        if not match:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        field, op, value = match.group(1).strip(), match.group(2), match.group(3).strip()
        if field not in allowed:
            if is_custom:
                raise bad_request(
                    f'"{field}" is not a known field selector: only "metadata.name", '
                    f'"metadata.namespace"'
                )
            raise bad_request(f"field label not supported: {field}")
        requirements.append(FieldRequirement(field, op != "!=", value))
    return requirements


def matches_fields(requirements: list[FieldRequirement], obj: Mapping[str, Any]) -> bool:
    return all(r.matches(obj) for r in requirements)
