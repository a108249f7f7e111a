"""Per-partition access: which client certificate identities may read or append.

The policy lives in one znode, ``<root>/access``, as JSON::

    {"default": {"read": ["audit-*"], "append": []},
     "partitions": {"0": {"read": ["payments", "audit-*"], "append": ["payments"]}}}

A partition's own rule wins over the default; a partition with neither is open to any
client (as when there is no policy at all). A rule lists shell-style patterns matched
against the identity in the client's verified certificate, so a rule is only useful
with client certificates: a connection without one matches no pattern.

``append`` lets a client append and mount (the feed's headers are how it learns what
committed); ``read`` also lets it read transaction data and ranges. Pure: no I/O.
"""

from __future__ import annotations

import enum
import fnmatch
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from .metadata import MetadataError

MAX_PATTERNS = 1000  # per rule and list: the policy is read on every server


class Access(enum.Enum):
    FEED = "feed"  # mount, feed, high-water mark, flush: read or append allows it
    APPEND = "append"
    READ = "read"  # transaction data and range reads


@dataclass(frozen=True)
class PartitionRule:
    read: tuple[str, ...] = ()
    append: tuple[str, ...] = ()

    def allows(self, identity: str | None, access: Access) -> bool:
        if identity is None:
            return False
        if access is Access.READ:
            patterns = self.read
        elif access is Access.APPEND:
            patterns = self.append
        else:
            patterns = self.read + self.append
        return any(fnmatch.fnmatchcase(identity, p) for p in patterns)

    def to_json(self) -> dict[str, list[str]]:
        return {"read": list(self.read), "append": list(self.append)}

    @classmethod
    def from_json(cls, doc: object, where: str) -> PartitionRule:
        if not isinstance(doc, dict):
            raise MetadataError(f"{where}: expected an object with read and append lists")
        unknown = set(doc) - {"read", "append"}
        if unknown:
            raise MetadataError(f"{where}: unknown keys {sorted(unknown)}")
        return cls(
            _patterns(doc.get("read", []), f"{where}.read"),
            _patterns(doc.get("append", []), f"{where}.append"),
        )


def _patterns(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(p, str) and p for p in value):
        raise MetadataError(f"{where}: expected a list of non-empty identity patterns")
    if len(value) > MAX_PATTERNS:
        raise MetadataError(f"{where}: {len(value)} patterns (at most {MAX_PATTERNS})")
    return tuple(dict.fromkeys(value))  # de-duplicated, in order


@dataclass(frozen=True)
class AccessPolicy:
    default: PartitionRule | None = None
    partitions: Mapping[int, PartitionRule] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return self.default is None and not self.partitions

    def rule_for(self, partition_id: int) -> PartitionRule | None:
        rule = self.partitions.get(partition_id)
        return rule if rule is not None else self.default

    def allows(self, identity: str | None, partition_id: int, access: Access) -> bool:
        rule = self.rule_for(partition_id)
        return rule is None or rule.allows(identity, access)

    # --- changes (for the admin CLI) ---------------------------------------------------

    def granted(
        self, targets: Iterable[int | None], identity: str, read: bool, append: bool
    ) -> AccessPolicy:
        """``identity`` (a pattern) added to each target's lists; None is the default."""

        def change(rule: PartitionRule) -> PartitionRule:
            return PartitionRule(
                rule.read + ((identity,) if read and identity not in rule.read else ()),
                rule.append + ((identity,) if append and identity not in rule.append else ()),
            )

        return self._changed(targets, change)

    def revoked(
        self, targets: Iterable[int | None], identity: str, read: bool, append: bool
    ) -> AccessPolicy:
        """``identity`` removed from each target's lists (the rule stays, maybe empty:
        removing the last identity must not open the partition to everyone)."""

        def change(rule: PartitionRule) -> PartitionRule:
            return PartitionRule(
                tuple(p for p in rule.read if not (read and p == identity)),
                tuple(p for p in rule.append if not (append and p == identity)),
            )

        return self._changed(targets, change)

    def cleared(self, targets: Iterable[int | None]) -> AccessPolicy:
        """Each target's rule removed: the partition falls back to the default (or open)."""
        targets = set(targets)
        return AccessPolicy(
            None if None in targets else self.default,
            {p: r for p, r in self.partitions.items() if p not in targets},
        )

    def _changed(
        self, targets: Iterable[int | None], change: Callable[[PartitionRule], PartitionRule]
    ) -> AccessPolicy:
        default, partitions = self.default, dict(self.partitions)
        for target in targets:
            if target is None:
                default = change(default or PartitionRule())
            else:
                partitions[target] = change(partitions.get(target) or PartitionRule())
        return AccessPolicy(default, partitions)

    # --- the znode -------------------------------------------------------------------------

    def encode(self) -> bytes:
        doc: dict[str, object] = {
            "partitions": {str(p): r.to_json() for p, r in sorted(self.partitions.items())}
        }
        if self.default is not None:
            doc["default"] = self.default.to_json()
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes, num_partitions: int | None = None) -> AccessPolicy:
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise MetadataError(f"access policy: not JSON: {e}") from None
        if not isinstance(doc, dict):
            raise MetadataError("access policy: expected a JSON object")
        unknown = set(doc) - {"default", "partitions"}
        if unknown:
            raise MetadataError(f"access policy: unknown keys {sorted(unknown)}")
        default = doc.get("default")
        rules = doc.get("partitions", {})
        if not isinstance(rules, dict):
            raise MetadataError("access policy: partitions must map partition IDs to rules")
        partitions: dict[int, PartitionRule] = {}
        for key, rule in rules.items():
            if not key.isdigit() or (num_partitions is not None and int(key) >= num_partitions):
                raise MetadataError(f"access policy: no partition {key!r} in this cluster")
            partitions[int(key)] = PartitionRule.from_json(rule, f"partitions.{key}")
        return cls(
            PartitionRule.from_json(default, "default") if default is not None else None,
            partitions,
        )

    def describe(self) -> list[str]:
        """One line per rule, for people."""

        def line(name: str, rule: PartitionRule) -> str:
            read = ", ".join(rule.read) or "nobody"
            append = ", ".join(rule.append) or "nobody"
            return f"{name}: read {read}; append {append}"

        if self.empty:
            return ["no access rules: every client may read and append every partition"]
        lines = [line(f"partition {p}", r) for p, r in sorted(self.partitions.items())]
        if self.default is not None:
            lines.append(line("every other partition", self.default))
        else:
            lines.append("every other partition: open to every client")
        return lines


# No rules: what a cluster without an access policy has.
OPEN_ACCESS = AccessPolicy()

# Every partition refused to everyone: a server's policy until it has read the real one.
DENY_ALL = AccessPolicy(default=PartitionRule())
