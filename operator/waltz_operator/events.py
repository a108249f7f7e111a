"""A Kubernetes Event the operator posts about a WaltzCluster (the handlers post them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str
