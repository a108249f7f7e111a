"""Retention: how much of each partition's log the cluster keeps.

The policy lives in one znode, ``<root>/retention``, as JSON::

    {"default": {"max_age_seconds": 604800, "max_bytes": null},
     "partitions": {"3": {"max_age_seconds": null, "max_bytes": 10737418240}},
     "truncate_before": {"0": 120000}}

A partition's own rule wins over the default; with neither, the partition keeps
everything. ``max_age_seconds`` deletes what was written longer ago than that;
``max_bytes`` keeps about that many bytes per replica (whole segments, so a little
more). ``truncate_before`` is what applications ask for explicitly (``waltz cluster
truncate-before``): everything below that transaction may go. Only whole sealed
segments are ever deleted; the owning server decides the partition's log start from
this policy, records it in the partition's metadata, then tells the replicas.

Pure: no I/O. ``next_log_start`` is the decision.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .metadata import MetadataError

MAX_AGE_SECONDS = 100 * 365 * 24 * 3600
MAX_BYTES = 1 << 60


@dataclass(frozen=True)
class RetentionRule:
    max_age_seconds: int | None = None
    max_bytes: int | None = None

    @property
    def keeps_everything(self) -> bool:
        return self.max_age_seconds is None and self.max_bytes is None

    def to_json(self) -> dict[str, int | None]:
        return {"max_age_seconds": self.max_age_seconds, "max_bytes": self.max_bytes}

    @classmethod
    def from_json(cls, doc: object, where: str) -> RetentionRule:
        if not isinstance(doc, dict):
            raise MetadataError(f"{where}: expected an object with max_age_seconds, max_bytes")
        unknown = set(doc) - {"max_age_seconds", "max_bytes"}
        if unknown:
            raise MetadataError(f"{where}: unknown keys {sorted(unknown)}")
        return cls(
            _limit(doc.get("max_age_seconds"), f"{where}.max_age_seconds", MAX_AGE_SECONDS),
            _limit(doc.get("max_bytes"), f"{where}.max_bytes", MAX_BYTES),
        )

    def describe(self) -> str:
        if self.keeps_everything:
            return "keep everything"
        parts = []
        if self.max_age_seconds is not None:
            parts.append(f"max age {format_duration(self.max_age_seconds)}")
        if self.max_bytes is not None:
            parts.append(f"max {self.max_bytes} bytes per replica")
        return ", ".join(parts)


def _limit(value: object, where: str, maximum: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise MetadataError(f"{where}: expected null or an integer in 1..{maximum}, got {value!r}")
    return value


@dataclass(frozen=True)
class RetentionPolicy:
    default: RetentionRule = RetentionRule()
    partitions: Mapping[int, RetentionRule] = field(default_factory=dict)
    truncate_before: Mapping[int, int] = field(default_factory=dict)

    def rule_for(self, partition_id: int) -> RetentionRule:
        return self.partitions.get(partition_id, self.default)

    def floor(self, partition_id: int) -> int:
        """Everything below this transaction may go on the application's word."""
        return self.truncate_before.get(partition_id, 0)

    # --- changes (for the admin CLI) ---------------------------------------------------

    def with_rule(self, targets: Iterable[int | None], rule: RetentionRule) -> RetentionPolicy:
        """Each target (None: the default) gets ``rule``."""
        default, partitions = self.default, dict(self.partitions)
        for target in targets:
            if target is None:
                default = rule
            else:
                partitions[target] = rule
        return RetentionPolicy(default, partitions, self.truncate_before)

    def without_rule(self, targets: Iterable[int | None]) -> RetentionPolicy:
        """Each target's own rule removed (the default goes back to keeping everything)."""
        targets = set(targets)
        return RetentionPolicy(
            RetentionRule() if None in targets else self.default,
            {p: r for p, r in self.partitions.items() if p not in targets},
            self.truncate_before,
        )

    def truncated_before(self, partition_id: int, transaction_id: int) -> RetentionPolicy:
        """The floor raised to ``transaction_id`` (never lowered: what went is gone)."""
        floors = dict(self.truncate_before)
        floors[partition_id] = max(floors.get(partition_id, 0), transaction_id)
        return RetentionPolicy(self.default, self.partitions, floors)

    def describe(self) -> list[str]:
        lines = [f"default: {self.default.describe()}"]
        lines += [f"partition {p}: {r.describe()}" for p, r in sorted(self.partitions.items())]
        lines += [
            f"partition {p}: truncated before transaction {t}"
            for p, t in sorted(self.truncate_before.items())
        ]
        return lines

    # --- the znode -------------------------------------------------------------------------

    def encode(self) -> bytes:
        doc = {
            "default": self.default.to_json(),
            "partitions": {str(p): r.to_json() for p, r in sorted(self.partitions.items())},
            "truncate_before": {str(p): t for p, t in sorted(self.truncate_before.items())},
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes, num_partitions: int) -> RetentionPolicy:
        try:
            doc = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise MetadataError(f"retention: not a JSON document ({e})") from None
        if not isinstance(doc, dict):
            raise MetadataError("retention: expected a JSON object")
        unknown = set(doc) - {"default", "partitions", "truncate_before"}
        if unknown:
            raise MetadataError(f"retention: unknown keys {sorted(unknown)}")
        default = RetentionRule.from_json(doc.get("default", {}), "retention.default")
        partitions = {
            _partition(key, num_partitions, "retention.partitions"): RetentionRule.from_json(
                rule, f"retention.partitions.{key}"
            )
            for key, rule in _object(doc.get("partitions", {}), "retention.partitions").items()
        }
        floors: dict[int, int] = {}
        for key, value in _object(
            doc.get("truncate_before", {}), "retention.truncate_before"
        ).items():
            p = _partition(key, num_partitions, "retention.truncate_before")
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise MetadataError(
                    f"retention.truncate_before.{key}: expected a transaction ID >= 0, "
                    f"got {value!r}"
                )
            floors[p] = value
        return cls(default, partitions, floors)


def _object(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise MetadataError(f"{where}: expected an object")
    return value


def _partition(key: str, num_partitions: int, where: str) -> int:
    if not key.isdigit() or not 0 <= int(key) < num_partitions:
        raise MetadataError(f"{where}: {key!r} is not a partition ID in 0..{num_partitions - 1}")
    return int(key)


# --- the decision -------------------------------------------------------------------------


@dataclass(frozen=True)
class SegmentInfo:
    """What a replica reports of one segment (oldest first)."""

    first_txid: int
    records: int
    size_bytes: int
    modified_ms: int
    last_commit_ms: int = -1  # its last record's commit time (-1: none, an older record)

    @property
    def age_from_ms(self) -> int:
        """When the segment's newest transaction was committed: its own commit time where
        it has one (the same on every replica, and kept by a copy or a restore), else
        when the file last changed (a segment of records written before commit times)."""
        return self.last_commit_ms if self.last_commit_ms >= 0 else self.modified_ms


def next_log_start(
    rule: RetentionRule,
    floor: int,
    segments: Sequence[SegmentInfo],
    *,
    now_ms: int,
    high_water_mark: int,
    current: int,
) -> int:
    """The partition's new log start (at least ``current``; at most one past the
    committed ``high_water_mark``, so nothing uncommitted and nothing a reader has not
    had a chance to see as committed is ever dropped).

    By age and size it only ever moves to a segment boundary below the last segment (the
    one being written), so a replica deletes whole segments; the explicit ``floor`` may
    land inside a segment, which then stays until the start passes its end.
    """
    start = max(current, floor)
    sealed = list(segments[:-1])  # the last segment is being written: never by age/size
    if rule.max_age_seconds is not None:
        oldest_kept = now_ms - rule.max_age_seconds * 1000
        for i, seg in enumerate(sealed):
            if seg.age_from_ms < oldest_kept:
                start = max(start, segments[i + 1].first_txid)
    if rule.max_bytes is not None:
        kept = sum(seg.size_bytes for seg in segments)
        for i, seg in enumerate(sealed):
            if kept <= rule.max_bytes:
                break
            kept -= seg.size_bytes
            start = max(start, segments[i + 1].first_txid)
    return min(start, high_water_mark + 1)


# --- the CLI's units ---------------------------------------------------------------------

_DURATION = re.compile(r"^\s*(\d+)\s*([smhdw]?)\s*$", re.IGNORECASE)
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> int:
    """``90``, ``90s``, ``15m``, ``12h``, ``7d``, ``2w`` -> seconds."""
    m = _DURATION.match(text)
    if not m or int(m.group(1)) == 0:
        raise ValueError(f"expected a duration such as 3600, 15m, 12h or 7d, got {text!r}")
    return int(m.group(1)) * _SECONDS[m.group(2).lower()]


def format_duration(seconds: int) -> str:
    for unit in ("w", "d", "h", "m"):
        if seconds % _SECONDS[unit] == 0:
            return f"{seconds // _SECONDS[unit]}{unit}"
    return f"{seconds}s"
