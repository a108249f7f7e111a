"""Whether an owned object needs applying again. Pure.

The operator used to server-side-apply every object of every cluster on every reconcile
(every 10 s): a write each, and a new resourceVersion sent to every watcher, for nothing.
It now watches the objects it owns (kopf indexes, kept by watch streams) and applies one
only when the desired object changed since it last applied it, the object is missing, or
a field it sets no longer has its value (someone edited it). The first reconcile after a
start applies everything once: a field an older operator set and this one no longer sets
goes then, as server-side apply removes a field its manager stops sending.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

Key = tuple[str, str, str]  # kind, namespace, name


def key_of(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return (str(obj.get("kind")), str(meta.get("namespace")), str(meta.get("name")))


def digest(obj: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def holds(live: Any, desired: Any) -> bool:
    """Every field of ``desired`` has its value in ``live`` (which may hold more: the API
    server's defaults, other managers' fields, status). Lists match item by item."""
    if isinstance(desired, Mapping):
        return isinstance(live, Mapping) and all(
            k in live and holds(live[k], v) for k, v in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(live, list)
            and len(live) == len(desired)
            and all(holds(a, b) for a, b in zip(live, desired, strict=True))
        )
    return live == desired


def needs_apply(
    desired: Mapping[str, Any], live: Mapping[str, Any] | None, last_applied: str | None
) -> bool:
    """``live``: the watched object (None: not there); ``last_applied``: the digest of what
    this process applied last (None: nothing yet)."""
    if live is None or last_applied != digest(desired):
        return True
    return not holds(live, desired)


def controlled_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether the WaltzCluster with this uid is the object's controller (an object made
    before the resource had a uid, in tests, counts as its own)."""
    refs = [
        r for r in (obj.get("metadata") or {}).get("ownerReferences") or [] if r.get("controller")
    ]
    if not refs:
        return not uid
    return any(r.get("kind") == "WaltzCluster" and r.get("uid") == uid for r in refs)
