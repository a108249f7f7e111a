"""``x-kubernetes-validations``: CEL rules evaluated with celpy, with the parts of the
Kubernetes CEL library CRDs use (``quantity()`` and its methods, the string and list
extensions), transition rules (``oldSelf``) and ``messageExpression``.

A transition rule (one that names ``oldSelf``) runs only on an update, and only where
the old object has a value at the rule's place, as kube-apiserver runs it
(``optionalOldSelf`` is not supported).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

import celpy
from celpy import celtypes

from .errors import FieldError, json_type
from .quantity import QuantityError, parse_quantity


class Quantity:
    """A CEL ``Quantity`` value."""

    def __init__(self, value: Fraction) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.value == other.value

    def __hash__(self) -> int:
        return hash(self.value)


def _quantity(text: Any) -> Quantity:
    try:
        return Quantity(parse_quantity(str(text)))
    except QuantityError as e:
        raise ValueError(f"quantity: {e}") from e


def _compare(a: Quantity, b: Quantity) -> celtypes.IntType:
    return celtypes.IntType((a.value > b.value) - (a.value < b.value))


def _index_of(haystack: Any, needle: Any) -> celtypes.IntType:
    if isinstance(haystack, list):
        return celtypes.IntType(haystack.index(needle) if needle in haystack else -1)
    return celtypes.IntType(str(haystack).find(str(needle)))


def _join(items: Any, separator: Any = "") -> celtypes.StringType:
    return celtypes.StringType(str(separator).join(str(i) for i in items))


FUNCTIONS: dict[str, Callable[..., Any]] = {
    # Kubernetes' quantity library
    "quantity": _quantity,
    "isQuantity": lambda s: celtypes.BoolType(_is_quantity(s)),
    "compareTo": _compare,
    "isGreaterThan": lambda a, b: celtypes.BoolType(a.value > b.value),
    "isLessThan": lambda a, b: celtypes.BoolType(a.value < b.value),
    "add": lambda a, b: Quantity(a.value + (b.value if isinstance(b, Quantity) else int(b))),
    "sub": lambda a, b: Quantity(a.value - (b.value if isinstance(b, Quantity) else int(b))),
    "sign": lambda a: celtypes.IntType((a.value > 0) - (a.value < 0)),
    "isInteger": lambda a: celtypes.BoolType(a.value.denominator == 1),
    "asInteger": lambda a: celtypes.IntType(int(a.value)),
    "asApproximateFloat": lambda a: celtypes.DoubleType(float(a.value)),
    # the strings extension
    "lowerAscii": lambda s: celtypes.StringType(str(s).lower()),
    "upperAscii": lambda s: celtypes.StringType(str(s).upper()),
    "trim": lambda s: celtypes.StringType(str(s).strip()),
    "replace": lambda s, a, b: celtypes.StringType(str(s).replace(str(a), str(b))),
    "split": lambda s, sep: celtypes.ListType(
        [celtypes.StringType(p) for p in str(s).split(str(sep))]
    ),
    "join": _join,
    "indexOf": _index_of,
    "lastIndexOf": lambda s, sub: celtypes.IntType(str(s).rfind(str(sub))),
    "substring": lambda s, a, b=None: celtypes.StringType(
        str(s)[int(a) :] if b is None else str(s)[int(a) : int(b)]
    ),
    "charAt": lambda s, i: celtypes.StringType(str(s)[int(i) : int(i) + 1]),
    # the lists extension
    "isSorted": lambda items: celtypes.BoolType(list(items) == sorted(items)),
    "sum": lambda items: sum(items[1:], items[0]) if items else celtypes.IntType(0),
    "min": lambda items: min(items),
    "max": lambda items: max(items),
    # the regex extension
    "find": lambda s, r: celtypes.StringType(
        m.group(0) if (m := re.search(str(r), str(s))) else ""
    ),
    "findAll": lambda s, r: celtypes.ListType(
        [celtypes.StringType(m.group(0)) for m in re.finditer(str(r), str(s))]
    ),
}


def _is_quantity(text: Any) -> bool:
    try:
        parse_quantity(str(text))
    except QuantityError:
        return False
    return True


_ENV = celpy.Environment()


@functools.cache
def _program(expression: str) -> Any:
    return _ENV.program(_ENV.compile(expression), functions=FUNCTIONS)


def compile_check(expression: str) -> None:
    """Raise if the expression does not compile (a CRD with such a rule is refused)."""
    _program(expression)


def is_transition_rule(rule: str) -> bool:
    return re.search(r"\boldSelf\b", rule) is not None


_KINDS = {
    "FieldValueInvalid": "Invalid",
    "FieldValueForbidden": "Forbidden",
    "FieldValueRequired": "Required",
    "FieldValueDuplicate": "Duplicate",
}


def evaluate_rules(
    rules: list[Mapping[str, Any]],
    value: Any,
    old: Any,
    has_old: bool,
    path: str,
) -> list[FieldError]:
    """The errors of ``rules`` (a node's x-kubernetes-validations) for ``value`` at
    ``path``; ``old`` is the old object's value there when ``has_old``."""
    errors: list[FieldError] = []
    activation: dict[str, Any] | None = None
    for rule in rules:
        expression = rule["rule"]
        transition = is_transition_rule(expression)
        if transition and not has_old:
            continue  # a transition rule: updates only, where the old value exists
        if activation is None:
            activation = {"self": celpy.json_to_cel(value)}
        if transition and "oldSelf" not in activation:
            activation["oldSelf"] = celpy.json_to_cel(old)
        where = path + (rule.get("fieldPath") or "")
        try:
            ok = _program(expression).evaluate(activation)
        except Exception as e:  # a runtime error fails the rule, naming why
            errors.append(
                FieldError(
                    "Invalid",
                    where,
                    f"{e.args[0] if e.args else e} evaluating rule: {expression}",
                    json_type(value),
                )
            )
            continue
        if bool(ok):
            continue
        message = rule.get("message") or f"failed rule: {expression}"
        if rule.get("messageExpression"):
            try:
                produced = _program(rule["messageExpression"]).evaluate(activation)
                if isinstance(produced, str) and produced.strip():
                    message = str(produced)
            except Exception:
                pass  # kube-apiserver falls back to message too
        kind = _KINDS.get(rule.get("reason") or "FieldValueInvalid", "Invalid")
        if kind == "Invalid":
            errors.append(FieldError("Invalid", where, message, json_type(value)))
        elif kind == "Duplicate":
            errors.append(FieldError("Duplicate", where, message, value))
        else:
            errors.append(FieldError(kind, where, message))
    return errors
