"""Kubernetes resource quantities (``10Gi``, ``500m``, ``1e3``): parsed exactly, compared
as the API server compares them (PVC sizes; CEL's ``quantity()`` library)."""

from __future__ import annotations

import re
from fractions import Fraction

_SUFFIXES = {
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}

# The grammar of k8s.io/apimachinery/pkg/api/resource.ParseQuantity.
_QUANTITY = re.compile(
    r"^(?P<sign>[+-]?)(?P<number>[0-9]+(\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE](?P<exp>[+-]?[0-9]+))?$"
)


class QuantityError(ValueError):
    pass


def parse_quantity(text: str | int | float) -> Fraction:
    """The value of a quantity; QuantityError if it is not one."""
    if isinstance(text, bool):
        raise QuantityError(f"quantities must match the regular expression: {text!r}")
    if isinstance(text, int):
        return Fraction(text)
    if isinstance(text, float):
        return Fraction(text)
    match = _QUANTITY.match(text.strip() if isinstance(text, str) else "")
    if not match or text != text.strip():
        raise QuantityError(
            "quantities must match the regular expression "
            "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
        )
    value = Fraction(match["number"]) * (-1 if match["sign"] == "-" else 1)
    if match["exp"] is not None:
        return value * Fraction(10) ** int(match["exp"])
    return value * _SUFFIXES[match["suffix"] or ""]


def is_quantity(text: object) -> bool:
    try:
        parse_quantity(text)  # type: ignore[arg-type]
    except QuantityError:
        return False
    return True
