"""Versioned codecs for every metadata znode.

Each znode holds one UTF-8 JSON object with a ``"version"`` field, so an
operator can read it with any ZooKeeper tool and a later release can evolve
it. Decoding is strict: a wrong type, a missing field or an unknown version
raises MetadataError naming the field. docs/zookeeper.md has the schemas.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, field
from typing import Any, TypeVar

CODEC_VERSION = 1
# The closing high-water mark of a session still running or not yet resolved by recovery.
# Not -1: a session can close having committed nothing, and "resolved to -1" must differ.
UNRESOLVED = -2
NO_SESSION = -1

_T = TypeVar("_T")


class MetadataError(ValueError):
    """A znode's data does not decode; the message names the node kind and the field."""


def _encode(kind: str, body: dict[str, Any]) -> bytes:
    return json.dumps(
        {"version": CODEC_VERSION, "kind": kind, **body}, sort_keys=True, separators=(",", ":")
    ).encode()


def _load(kind: str, data: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MetadataError(f"{kind}: not a JSON document ({e})") from None
    if not isinstance(doc, dict):
        raise MetadataError(f"{kind}: expected a JSON object")
    if doc.get("kind") != kind:
        raise MetadataError(f"{kind}: the node holds {doc.get('kind')!r} metadata")
    version = doc.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version != CODEC_VERSION:
        raise MetadataError(
            f"{kind}: codec version {doc.get('version')!r} is not supported "
            f"(this build reads {CODEC_VERSION})"
        )
    return doc


def _field(
    kind: str, doc: dict[str, Any], name: str, typ: type[_T], *, minimum: int | None = None
) -> _T:
    if name not in doc:
        raise MetadataError(f"{kind}: missing field {name!r}")
    value = doc[name]
    if typ is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise MetadataError(f"{kind}: field {name!r} must be an integer, got {value!r}")
    if typ is not int and not isinstance(value, typ):
        raise MetadataError(f"{kind}: field {name!r} must be {typ.__name__}, got {value!r}")
    if minimum is not None and value < minimum:
        raise MetadataError(f"{kind}: field {name!r} must be >= {minimum}, got {value}")
    checked: _T = value  # a typ, as checked above
    return checked


def _string_list(kind: str, doc: dict[str, Any], name: str) -> tuple[str, ...]:
    value = _field(kind, doc, name, list)
    if not all(isinstance(v, str) for v in value):
        raise MetadataError(f"{kind}: field {name!r} must be a list of strings, got {value!r}")
    return tuple(value)


def _partition_list(kind: str, value: Any, where: str) -> frozenset[int]:
    if not isinstance(value, list) or not all(
        isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in value
    ):
        raise MetadataError(f"{kind}: {where} must be a list of partition IDs, got {value!r}")
    return frozenset(value)


def validate_storage_address(address: str) -> str:
    """``host:port`` with a port in 1..65535; ValueError says what is wrong."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(f"storage address {address!r} is not host:port")
    return address


# --- cluster parameters ---------------------------------------------------------------


def key_fingerprint(key: uuid.UUID) -> str:
    """A cluster key's name for messages and logs: its SHA-256 prefix, which tells two keys
    apart without revealing either (the key itself is never printed, even in part)."""
    return "sha256:" + hashlib.sha256(key.bytes).hexdigest()[:12]


@dataclass(frozen=True)
class ClusterParams:
    name: str
    key: uuid.UUID
    num_partitions: int
    num_replicas: int

    KIND = "cluster"

    def encode(self) -> bytes:
        return _encode(
            self.KIND,
            {
                "name": self.name,
                "key": str(self.key),
                "num_partitions": self.num_partitions,
                "num_replicas": self.num_replicas,
            },
        )

    def grown_to(self, newer: ClusterParams) -> int | None:
        """The partition count ``newer`` (a later read of the cluster node) grows this
        cluster to; None when it has as many. MetadataError when ``newer`` is not this
        cluster grown: another key, or fewer partitions (they are never removed)."""
        if newer.key != self.key:
            raise MetadataError(
                f"the cluster node now has the key {key_fingerprint(newer.key)}, not "
                f"{key_fingerprint(self.key)}: not this cluster"
            )
        if newer.num_partitions < self.num_partitions:
            raise MetadataError(
                f"the cluster node now has {newer.num_partitions} partitions, fewer than "
                f"{self.num_partitions} (partitions are never removed)"
            )
        return newer.num_partitions if newer.num_partitions > self.num_partitions else None

    @classmethod
    def decode(cls, data: bytes) -> ClusterParams:
        doc = _load(cls.KIND, data)
        raw_key = _field(cls.KIND, doc, "key", str)
        try:
            key = uuid.UUID(raw_key)
        except ValueError:
            raise MetadataError(f"cluster: field 'key' is not a UUID: {raw_key!r}") from None
        return cls(
            _field(cls.KIND, doc, "name", str),
            key,
            _field(cls.KIND, doc, "num_partitions", int, minimum=1),
            _field(cls.KIND, doc, "num_replicas", int, minimum=1),
        )


# --- replica assignment ---------------------------------------------------------------


@dataclass(frozen=True)
class ReplicaAssignment:
    """Which storage node (``host:port``) holds which partitions; ``groups`` are optional
    failure domains (a zone, a rack) used when placing replicas."""

    storages: dict[str, frozenset[int]]
    groups: dict[str, int] = field(default_factory=dict)

    KIND = "replica-assignment"

    def replicas_of(self, partition_id: int) -> list[str]:
        return sorted(s for s, parts in self.storages.items() if partition_id in parts)

    def problems(self, num_partitions: int, num_replicas: int) -> list[str]:
        """Why this assignment does not serve the cluster (empty when it does)."""
        out = []
        for s, parts in sorted(self.storages.items()):
            bad = sorted(p for p in parts if p >= num_partitions)
            if bad:
                out.append(f"{s} holds partitions {bad} outside 0..{num_partitions - 1}")
        for p in range(num_partitions):
            n = len(self.replicas_of(p))
            if n < num_replicas:
                out.append(f"partition {p} has {n} replicas, the cluster needs {num_replicas}")
        return out

    def encode(self) -> bytes:
        return _encode(
            self.KIND,
            {
                "storages": {
                    s: {"group": self.groups.get(s, 0), "partitions": sorted(parts)}
                    for s, parts in self.storages.items()
                }
            },
        )

    @classmethod
    def decode(cls, data: bytes) -> ReplicaAssignment:
        doc = _load(cls.KIND, data)
        raw = _field(cls.KIND, doc, "storages", dict)
        storages: dict[str, frozenset[int]] = {}
        groups: dict[str, int] = {}
        for s, entry in raw.items():
            try:
                validate_storage_address(s)
            except ValueError as e:
                raise MetadataError(f"{cls.KIND}: {e}") from None
            if not isinstance(entry, dict):
                raise MetadataError(f"{cls.KIND}: entry of {s} must be an object")
            storages[s] = _partition_list(cls.KIND, entry.get("partitions"), f"{s}.partitions")
            groups[s] = _field(cls.KIND, entry, "group", int, minimum=0)
        return cls(storages, groups)


# --- partition metadata ---------------------------------------------------------------


@dataclass(frozen=True)
class ReplicaState:
    """The store session a replica is engaged in, and the closing high-water mark of the
    session it left (UNRESOLVED until recovery resolves it)."""

    session_id: int = NO_SESSION
    closing_high_water_mark: int = UNRESOLVED


@dataclass(frozen=True)
class PartitionMetadata:
    generation: int = 0
    session_id: int = NO_SESSION
    replicas: dict[str, ReplicaState] = field(default_factory=dict)
    # Retention: the first transaction still served; everything below it may be deleted.
    # Only the owning server moves it, and only up. Left out of the document while 0.
    log_start: int = 0

    KIND = "partition"

    def encode(self) -> bytes:
        doc: dict[str, Any] = {
            "generation": self.generation,
            "session_id": self.session_id,
            "replicas": {
                s: {
                    "session_id": r.session_id,
                    "closing_high_water_mark": r.closing_high_water_mark,
                }
                for s, r in self.replicas.items()
            },
        }
        if self.log_start:
            doc["log_start"] = self.log_start
        return _encode(self.KIND, doc)

    @classmethod
    def decode(cls, data: bytes) -> PartitionMetadata:
        doc = _load(cls.KIND, data)
        replicas = {}
        for s, entry in _field(cls.KIND, doc, "replicas", dict).items():
            if not isinstance(entry, dict):
                raise MetadataError(f"{cls.KIND}: replica state of {s} must be an object")
            replicas[s] = ReplicaState(
                _field(cls.KIND, entry, "session_id", int, minimum=NO_SESSION),
                _field(cls.KIND, entry, "closing_high_water_mark", int, minimum=UNRESOLVED),
            )
        return cls(
            _field(cls.KIND, doc, "generation", int, minimum=0),
            _field(cls.KIND, doc, "session_id", int, minimum=NO_SESSION),
            replicas,
            _field(cls.KIND, doc, "log_start", int, minimum=0) if "log_start" in doc else 0,
        )


# --- servers and partition ownership --------------------------------------------------


@dataclass(frozen=True)
class ServerRegistration:
    """What a live server publishes in its ephemeral node.

    ``tls_name``: the name clients check the server's TLS certificate against, when it is
    not ``host`` (on Kubernetes a server is dialled at its pod IP, which no certificate
    names, and proves the name of the cluster's client Service); empty: ``host``.
    Omitted from the node when empty, and ignored by readers that predate it.

    ``zk_auth``: the ZooKeeper identities its session authenticates as (``scheme:id``,
    ``acl.session_identities``), which ``waltz cluster secure`` checks; omitted when none."""

    server_id: str
    host: str
    port: int
    http_port: int
    tls_name: str = ""
    zk_auth: tuple[str, ...] = ()

    KIND = "server"

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def verified_name(self) -> str:
        """The name a client's TLS connection checks the server's certificate for."""
        return self.tls_name or self.host

    def encode(self) -> bytes:
        body: dict[str, Any] = {
            "server_id": self.server_id,
            "host": self.host,
            "port": self.port,
            "http_port": self.http_port,
        }
        if self.tls_name:
            body["tls_name"] = self.tls_name
        if self.zk_auth:
            body["zk_auth"] = list(self.zk_auth)
        return _encode(self.KIND, body)

    @classmethod
    def decode(cls, data: bytes) -> ServerRegistration:
        doc = _load(cls.KIND, data)
        return cls(
            _field(cls.KIND, doc, "server_id", str),
            _field(cls.KIND, doc, "host", str),
            _field(cls.KIND, doc, "port", int, minimum=0),
            _field(cls.KIND, doc, "http_port", int, minimum=0),
            _field(cls.KIND, doc, "tls_name", str) if "tls_name" in doc else "",
            _string_list(cls.KIND, doc, "zk_auth") if "zk_auth" in doc else (),
        )


@dataclass(frozen=True)
class Ownership:
    """Partition -> (owning server ID or None, generation). Every move bumps the generation."""

    partitions: dict[int, tuple[str | None, int]]

    KIND = "ownership"

    def encode(self) -> bytes:
        return _encode(
            self.KIND,
            {
                "partitions": {
                    str(p): {"server": s, "generation": g}
                    for p, (s, g) in sorted(self.partitions.items())
                }
            },
        )

    @classmethod
    def decode(cls, data: bytes) -> Ownership:
        doc = _load(cls.KIND, data)
        out: dict[int, tuple[str | None, int]] = {}
        for p, entry in _field(cls.KIND, doc, "partitions", dict).items():
            if not (p.isascii() and p.isdigit()) or not isinstance(entry, dict):
                raise MetadataError(f"{cls.KIND}: bad entry {p!r}")
            server = entry.get("server")
            if server is not None and not isinstance(server, str):
                raise MetadataError(f"{cls.KIND}: partition {p} server must be a string or null")
            out[int(p)] = (server, _field(cls.KIND, entry, "generation", int, minimum=0))
        return cls(out)


# --- storage replacements -------------------------------------------------------------

# Events kept in the record: enough for `waltz cluster show` to tell what happened lately.
MAX_REPLACEMENT_EVENTS = 100


@dataclass(frozen=True)
class ReplacementEvent:
    """One step of a storage node's replacement, as `waltz cluster show` lists it."""

    time_ms: int
    storage: str  # the node being replaced
    action: str  # "started", "assigned", "unassigned", "removed"
    partitions: tuple[int, ...] = ()
    to: str = ""  # the new replica's node, for "assigned"
    detail: str = ""


REPLACEMENT_ACTIONS = ("started", "assigned", "unassigned", "removed", "cancelled")


@dataclass(frozen=True)
class Replacing:
    """A replacement under way: since when (ms), why, and whether the servers started it
    (``replace_storage_after``) or a person did (``waltz cluster replace-storage``)."""

    since_ms: int
    reason: str
    automatic: bool


@dataclass(frozen=True)
class StorageReplacements:
    """The storage nodes being replaced and the latest steps taken. A replacement
    recorded here is carried on by whichever server is the assigner; one the servers
    started themselves (``automatic``) is cancelled if its node is reachable again before
    any partition took a new replica."""

    replacing: dict[str, Replacing] = field(default_factory=dict)
    events: tuple[ReplacementEvent, ...] = ()

    KIND = "storage-replacements"

    def with_events(self, *events: ReplacementEvent) -> StorageReplacements:
        kept = (*self.events, *events)[-MAX_REPLACEMENT_EVENTS:]
        return StorageReplacements(dict(self.replacing), kept)

    def encode(self) -> bytes:
        return _encode(
            self.KIND,
            {
                "replacing": {
                    s: {"since_ms": r.since_ms, "reason": r.reason, "automatic": r.automatic}
                    for s, r in sorted(self.replacing.items())
                },
                "events": [
                    {
                        "time_ms": e.time_ms,
                        "storage": e.storage,
                        "action": e.action,
                        "partitions": list(e.partitions),
                        "to": e.to,
                        "detail": e.detail,
                    }
                    for e in self.events
                ],
            },
        )

    @classmethod
    def decode(cls, data: bytes) -> StorageReplacements:
        doc = _load(cls.KIND, data)
        replacing: dict[str, Replacing] = {}
        for s, entry in _field(cls.KIND, doc, "replacing", dict).items():
            if not isinstance(entry, dict):
                raise MetadataError(f"{cls.KIND}: entry of {s} must be an object")
            replacing[s] = Replacing(
                _field(cls.KIND, entry, "since_ms", int, minimum=0),
                _field(cls.KIND, entry, "reason", str),
                _field(cls.KIND, entry, "automatic", bool),
            )
        events = []
        for entry in _field(cls.KIND, doc, "events", list):
            if not isinstance(entry, dict):
                raise MetadataError(f"{cls.KIND}: an event must be an object, got {entry!r}")
            action = _field(cls.KIND, entry, "action", str)
            if action not in REPLACEMENT_ACTIONS:
                raise MetadataError(f"{cls.KIND}: unknown event action {action!r}")
            events.append(
                ReplacementEvent(
                    _field(cls.KIND, entry, "time_ms", int, minimum=0),
                    _field(cls.KIND, entry, "storage", str),
                    action,
                    tuple(sorted(_partition_list(cls.KIND, entry.get("partitions"), "partitions"))),
                    _field(cls.KIND, entry, "to", str),
                    _field(cls.KIND, entry, "detail", str),
                )
            )
        return cls(replacing, tuple(events))
