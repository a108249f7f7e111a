"""Changing the storage volumes of a running cluster. Pure.

The API server refuses any change to a StatefulSet's ``volumeClaimTemplates``. So a new
size (or new labels) reaches the volumes the way Strimzi and CloudNativePG take it: patch
each existing PersistentVolumeClaim (the storage driver grows the volume), then delete
the StatefulSet with ``propagationPolicy: Orphan`` (its pods and claims stay, and keep
running) and create it again with the new template; it adopts the same pods and claims.
A volume cannot shrink or change its storage class in place: those are refused, naming
the field, and nothing is changed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

_SUFFIXES = {
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?$")


def quantity(text: str) -> Decimal:
    """A Kubernetes resource quantity (``10Gi``, ``500M``, ``1e9``) as a number."""
    match = _QUANTITY.match(str(text).strip())
    if not match:
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    try:
        return Decimal(match.group(1)) * _SUFFIXES[match.group(2) or ""]
    except InvalidOperation:
        raise ValueError(f"not a Kubernetes quantity: {text!r}") from None


@dataclass(frozen=True)
class ClaimPatch:
    """Grow a claim's request and give it the template's labels."""

    name: str
    patch: Mapping[str, Any]


@dataclass(frozen=True)
class Recreate:
    """The template changed: patch these claims, then delete the StatefulSet with
    orphan propagation; the next reconcile creates it again."""

    patches: tuple[ClaimPatch, ...]
    reason: str


@dataclass(frozen=True)
class RefuseVolumeChange:
    reason: str


def _template(statefulset: Mapping[str, Any]) -> Mapping[str, Any]:
    templates = (statefulset.get("spec") or {}).get("volumeClaimTemplates") or [{}]
    return templates[0]


def _size(claim_or_template: Mapping[str, Any]) -> str:
    spec = claim_or_template.get("spec") or {}
    return str(((spec.get("resources") or {}).get("requests") or {}).get("storage", "0"))


def _class(claim_or_template: Mapping[str, Any]) -> str | None:
    return (claim_or_template.get("spec") or {}).get("storageClassName")


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def plan_volume_change(
    live: Mapping[str, Any], desired: Mapping[str, Any], claims: Sequence[Mapping[str, Any]]
) -> Recreate | RefuseVolumeChange | None:
    """What it takes to bring the live StatefulSet's volumes to the desired template (None:
    nothing). Only the fields the operator sets are compared: the API server fills in
    others (``volumeMode``, a default class) that are no change of ours."""
    have, want = _template(live), _template(desired)
    live_class, wanted_class = _class(have), _class(want)
    # A template without a class gave its claims the default class: naming that same
    # class now is no move; any other class is.
    claim_classes = {_class(c) for c in claims} if live_class is None else {live_class}
    if wanted_class != live_class and (wanted_class is None or claim_classes - {wanted_class}):
        return RefuseVolumeChange(
            f"spec.storage.storageClassName cannot change in place "
            f"({live_class or 'the default'} to {wanted_class or 'the default'}): a volume "
            f"keeps its class; set it back "
            f"(docs/operator.md: moving storage to another class)"
        )
    old_size, new_size = quantity(_size(have)), quantity(_size(want))
    if new_size < old_size:
        return RefuseVolumeChange(
            f"spec.storage.size cannot shrink ({_size(have)} to {_size(want)}): volumes "
            f"only grow; set it back to {_size(have)} or more"
        )
    wanted_labels = _labels(want)
    changed = [
        what
        for what, differs in (
            (f"size {_size(have)} to {_size(want)}", new_size != old_size),
            ("labels", _labels(have) != wanted_labels),
            (
                "access modes",
                (have.get("spec") or {}).get("accessModes")
                != (want.get("spec") or {}).get("accessModes"),
            ),
            ("storage class", wanted_class != live_class),
        )
        if differs
    ]
    if not changed:
        return None
    patches = []
    for claim in claims:
        patch: dict[str, Any] = {}
        if quantity(_size(claim)) < new_size:
            patch["spec"] = {"resources": {"requests": {"storage": _size(want)}}}
        missing = {k: v for k, v in wanted_labels.items() if _labels(claim).get(k) != v}
        if missing:
            patch["metadata"] = {"labels": missing}
        if patch:
            patches.append(ClaimPatch(claim["metadata"]["name"], patch))
    return Recreate(tuple(patches), "volume claim template changed: " + ", ".join(changed))


def resizing(claims: Sequence[Mapping[str, Any]]) -> list[str]:
    """Claims whose volume the driver has not grown to its requested size yet (not those
    that wait for their pod's restart: the roll does that)."""
    waiting = []
    for claim in claims:
        if needs_restart_to_resize(claim):
            continue
        capacity = ((claim.get("status") or {}).get("capacity") or {}).get("storage")
        if capacity is not None and quantity(capacity) < quantity(_size(claim)):
            waiting.append(claim["metadata"]["name"])
    return waiting


def needs_restart_to_resize(claim: Mapping[str, Any]) -> bool:
    """The driver grew the volume but its file system grows only when a pod mounts it."""
    return any(
        c.get("type") == "FileSystemResizePending" and c.get("status") == "True"
        for c in (claim.get("status") or {}).get("conditions") or []
    )
