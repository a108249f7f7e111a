"""Failure domains: which zone each storage node runs in, as the replica assignment's
placement groups. Pure.

The operator reads each storage pod's node and that node's zone label; nodes in the same
zone share a group, so ``next_rebalance_step`` spreads every partition's replicas over as
many zones as the cluster has. Group numbers only need to be equal within a zone and
different between zones: they are the zones' ranks in name order, from 1 (0 is a node
whose zone is not known, the assignment's default).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .desired import ZONE_LABEL

# Older clusters label nodes only with the beta name.
ZONE_LABELS = (ZONE_LABEL, "failure-domain.beta.kubernetes.io/zone")


def node_zone(node: Mapping[str, Any] | None) -> str | None:
    labels = ((node or {}).get("metadata") or {}).get("labels") or {}
    for label in ZONE_LABELS:
        if labels.get(label):
            return str(labels[label])
    return None


def zone_groups(zones: Mapping[str, str | None]) -> dict[str, int]:
    """Storage address -> group, from address -> zone (None: not known)."""
    rank = {zone: i + 1 for i, zone in enumerate(sorted({z for z in zones.values() if z}))}
    return {address: rank.get(zone, 0) if zone else 0 for address, zone in zones.items()}


def group_changes(known: Mapping[str, int], wanted: Mapping[str, int]) -> dict[str, int]:
    """The groups to write: those of the assignment's nodes whose group differs."""
    return {a: g for a, g in wanted.items() if a in known and known[a] != g}
