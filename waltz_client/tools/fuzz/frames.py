"""The pure core of ``waltz fuzz``: valid frames of every request type, with a map of
their fields.

``FuzzTarget`` is what the fuzzer knows of the daemon it fuzzes. A builder per request
type (``CLIENT_BUILDERS`` for the server's protocol, ``STORAGE_BUILDERS`` for the storage
node's) draws the request's fields from a seeded ``random.Random`` (mostly plausible,
sometimes boundary values), encodes it with the project's own encoder, and records where
each field sits in the bytes (``Field``): a mutation (``mutations``) aims at them.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from waltz_client.wire.client_messages import (
    CLIENT_REQUESTS,
    AllocateClientIdRequest,
    AppendRequest,
    ClientMessageType,
    FeedRequest,
    FindTimeRequest,
    FlushRequest,
    HighWaterMarkRequest,
    MountRequest,
    ReadRangeRequest,
    TransactionDataRequest,
)
from waltz_client.wire.records import Record, RecordBatch, ReqId
from waltz_client.wire.storage_messages import (
    STORAGE_REQUESTS,
    LastSessionInfoRequest,
    LogInfoRequest,
    MaxTransactionIdRequest,
    OpenRequest,
    RecordHeaderListRequest,
    RecordHeaderRequest,
    RecordListRequest,
    RecordRequest,
    SetLogStartRequest,
    SetLowWaterMarkRequest,
    StorageMessageType,
    TruncateRequest,
)
from waltz_client.wire.storage_messages import AppendRequest as StorageAppendRequest
from waltz_client.wire.storage_messages import FindTimeRequest as StorageFindTimeRequest

PROTOCOLS = ("server", "storage")


@dataclass(frozen=True, slots=True)
class Field:
    """Where a field sits in a frame (offsets count from the length prefix)."""

    offset: int
    width: int  # bytes: 1, 4, 8 or 16
    kind: str  # "length" (a count or byte length), "int", "crc" or "uuid"
    name: str


@dataclass(frozen=True, slots=True)
class Frame:
    """A valid frame as the project's encoder wrote it, and the fields a mutation aims at."""

    name: str  # the message class
    data: bytes
    fields: tuple[Field, ...]


@dataclass(frozen=True, slots=True)
class FuzzTarget:
    """What the fuzzer knows of the daemon it fuzzes."""

    protocol: str  # "server" or "storage"
    num_partitions: int = 4
    # Storage: the cluster's key makes Open succeed, so frames reach the partitions;
    # without it every Open is refused and only the unopened path is fuzzed.
    cluster_key: uuid.UUID | None = None
    # Storage: small session IDs, among them a young cluster's current sessions (anyone
    # who reads ZooKeeper learns them, docs/security.md), reach the partitions' logs.
    # False plays a stranger: every session ID a frame carries is kept away from them.
    replay_sessions: bool = True
    # A TLS port: a ClientHello its clients send (tls.capture_client_hello). Some
    # connections then send mutations of it over plain TCP, some handshake without a
    # client certificate; the rest handshake as the client and send frames inside TLS.
    tls_hello: bytes = b""

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {self.protocol!r}")
        if self.num_partitions < 1:
            raise ValueError(f"num_partitions must be at least 1, got {self.num_partitions}")


class _Layout:
    """Offsets of fields as an encoder lays them out, one after another."""

    __slots__ = ("fields", "pos")

    def __init__(self, pos: int) -> None:
        self.pos = pos
        self.fields: list[Field] = [Field(0, 4, "length", "frame length")]

    def add(self, name: str, width: int, kind: str = "int") -> None:
        self.fields.append(Field(self.pos, width, kind, name))
        self.pos += width

    def skip(self, n: int) -> None:
        self.pos += n


INT32_EDGES = (0, 1, -1, 2**31 - 1, -(2**31))
INT64_EDGES = (0, 1, -1, -2, 2**31, 2**63 - 1, -(2**63))
_HWM_EDGES = tuple(v for v in INT64_EDGES if v >= -1)


def _int32(rng: random.Random) -> int:
    return rng.choice(INT32_EDGES) if rng.random() < 0.1 else rng.randrange(-(2**31), 2**31)


def _partition(rng: random.Random, t: FuzzTarget) -> int:
    """Mostly a real partition (so requests reach its code), sometimes none."""
    if rng.random() < 0.9:
        return rng.randrange(t.num_partitions)
    return rng.choice((-1, t.num_partitions, 2**31 - 1, rng.randrange(-(2**31), 2**31)))


def _txid(rng: random.Random) -> int:
    r = rng.random()
    if r < 0.5:
        return rng.randrange(-1, 64)  # near a young log's end
    if r < 0.8:
        return rng.randrange(0, 1 << 40)
    return rng.choice(INT64_EDGES)


def _session(rng: random.Random) -> int:
    """Small IDs may be a partition's current store session; the rest are not."""
    r = rng.random()
    if r < 0.5:
        return rng.randrange(-1, 8)
    if r < 0.8:
        return rng.randrange(0, 1 << 62)
    return rng.choice(INT64_EDGES)


def _data(rng: random.Random) -> bytes:
    r = rng.random()
    if r < 0.2:
        return b""
    if r < 0.9:
        return rng.randbytes(rng.randrange(1, 64))
    return rng.randbytes(rng.randrange(64, 4096))


def _req_id(rng: random.Random, t: FuzzTarget) -> ReqId:
    client = rng.randrange(1, 100) if rng.random() < 0.5 else _int32(rng)
    generation = rng.randrange(-1, 4) if rng.random() < 0.7 else _int32(rng)
    return ReqId(client, generation, _partition(rng, t), rng.randrange(0, 2**31))


def _client_layout() -> _Layout:
    out = _Layout(5)
    for name in ("client_id", "generation", "partition_id", "seq"):
        out.add(f"ReqId.{name}", 4)
    return out


def _hwm(rng: random.Random) -> int:
    """A client high-water mark: -1 or a transaction ID (decoders refuse less)."""
    return rng.randrange(-1, 64) if rng.random() < 0.8 else rng.choice(_HWM_EDGES)


def _mount(rng: random.Random, t: FuzzTarget) -> Frame:
    m = MountRequest(_req_id(rng, t), _hwm(rng), rng.randrange(0, 8))
    out = _client_layout()
    out.add("Mount.client_high_water_mark", 8)
    out.add("Mount.connection_seq", 4)
    return Frame("MountRequest", m.encode(), tuple(out.fields))


def _locks(rng: random.Random) -> tuple[int, ...]:
    n = 0 if rng.random() < 0.5 else rng.randrange(1, 9)
    return tuple(rng.randrange(-(2**31), 2**31) for _ in range(n))


def _client_append(rng: random.Random, t: FuzzTarget) -> Frame:
    m = AppendRequest(
        _req_id(rng, t),
        _hwm(rng),
        _locks(rng),
        _locks(rng),
        _locks(rng),
        _int32(rng),
        _data(rng),
    )
    out = _client_layout()
    out.add("Append.client_high_water_mark", 8)
    for name, hashes in (
        ("write_locks", m.write_locks),
        ("read_locks", m.read_locks),
        ("append_locks", m.append_locks),
    ):
        out.add(f"Append.{name} count", 4, "length")
        for i in range(len(hashes)):
            out.add(f"Append.{name}[{i}]", 4)
    out.add("Append.header", 4)
    out.add("Append.data length", 4, "length")
    out.skip(len(m.data))
    out.add("Append.checksum", 4, "crc")
    return Frame("AppendRequest", m.encode(), tuple(out.fields))


def _feed(rng: random.Random, t: FuzzTarget) -> Frame:
    out = _client_layout()
    out.add("Feed.client_high_water_mark", 8)
    return Frame("FeedRequest", FeedRequest(_req_id(rng, t), _hwm(rng)).encode(), tuple(out.fields))


def _transaction_data(rng: random.Random, t: FuzzTarget) -> Frame:
    out = _client_layout()
    out.add("TransactionData.transaction_id", 8)
    m = TransactionDataRequest(_req_id(rng, t), _txid(rng))
    return Frame("TransactionDataRequest", m.encode(), tuple(out.fields))


def _flush(rng: random.Random, t: FuzzTarget) -> Frame:
    m = FlushRequest(_req_id(rng, t))
    return Frame("FlushRequest", m.encode(), tuple(_client_layout().fields))


def _allocate_client_id(rng: random.Random, t: FuzzTarget) -> Frame:
    m = AllocateClientIdRequest(_req_id(rng, t))
    return Frame("AllocateClientIdRequest", m.encode(), tuple(_client_layout().fields))


def _time_ms(rng: random.Random) -> int:
    """A commit time: mostly now-ish, sometimes none (-1) or an edge."""
    r = rng.random()
    if r < 0.8:
        return 1_800_000_000_000 + rng.randrange(1 << 30)
    return rng.choice((-1, 0, 1, 2**63 - 1, -(2**63)))


def _find_time(rng: random.Random, t: FuzzTarget) -> Frame:
    out = _client_layout()
    out.add("FindTime.timestamp", 8)
    m = FindTimeRequest(_req_id(rng, t), _time_ms(rng))
    return Frame("FindTimeRequest", m.encode(), tuple(out.fields))


def _storage_find_time(rng: random.Random, t: FuzzTarget) -> Frame:
    out = _storage_layout()
    out.add("FindTime.timestamp", 8)
    m = StorageFindTimeRequest(*_head(rng, t), _time_ms(rng))
    return Frame("FindTimeRequest", m.encode(), tuple(out.fields))


def _high_water_mark(rng: random.Random, t: FuzzTarget) -> Frame:
    m = HighWaterMarkRequest(_req_id(rng, t))
    return Frame("HighWaterMarkRequest", m.encode(), tuple(_client_layout().fields))


def _read_range(rng: random.Random, t: FuzzTarget) -> Frame:
    m = ReadRangeRequest(
        _req_id(rng, t),
        max(0, _txid(rng)),
        rng.randrange(1, 2000),
        rng.choice((1, 100, 64 * 1024, 4 * 1024 * 1024, 2**31 - 1)),
    )
    out = _client_layout()
    out.add("ReadRange.from_transaction_id", 8)
    out.add("ReadRange.max_records", 4, "length")
    out.add("ReadRange.max_bytes", 4, "length")
    return Frame("ReadRangeRequest", m.encode(), tuple(out.fields))


def _storage_layout() -> _Layout:
    out = _Layout(5)
    out.add("session id", 8)
    out.add("sequence number", 8)
    out.add("partition id", 4)
    return out


def _head(rng: random.Random, t: FuzzTarget) -> tuple[int, int, int]:
    return _session(rng), rng.randrange(0, 1 << 40), _partition(rng, t)


def open_request(rng: random.Random, t: FuzzTarget, seq: int = 1) -> Frame:
    """An Open as StorageClient.open sends it: the cluster key when known."""
    # Drawn even when the key is known: a plan must not depend on knowing it.
    guess = uuid.UUID(int=rng.getrandbits(128))
    m = OpenRequest(-1, seq, -1, t.cluster_key or guess, t.num_partitions)
    out = _storage_layout()
    out.add("Open.cluster_key", 16, "uuid")
    out.add("Open.num_partitions", 4)
    return Frame("OpenRequest", m.encode(), tuple(out.fields))


def _open(rng: random.Random, t: FuzzTarget) -> Frame:
    return open_request(rng, t, rng.randrange(0, 1 << 40))


def _no_body(cls: type) -> Callable[[random.Random, FuzzTarget], Frame]:
    def build(rng: random.Random, t: FuzzTarget) -> Frame:
        return Frame(cls.__name__, cls(*_head(rng, t)).encode(), tuple(_storage_layout().fields))

    return build


def _one_txid(cls: type, what: str) -> Callable[[random.Random, FuzzTarget], Frame]:
    def build(rng: random.Random, t: FuzzTarget) -> Frame:
        out = _storage_layout()
        out.add(what, 8)
        return Frame(cls.__name__, cls(*_head(rng, t), _txid(rng)).encode(), tuple(out.fields))

    return build


def _list_read(cls: type) -> Callable[[random.Random, FuzzTarget], Frame]:
    def build(rng: random.Random, t: FuzzTarget) -> Frame:
        n = rng.randrange(0, 2000) if rng.random() < 0.9 else 2**31 - 1
        out = _storage_layout()
        out.add(f"{cls.__name__}.transaction_id", 8)
        out.add(f"{cls.__name__}.max_records", 4, "length")
        return Frame(cls.__name__, cls(*_head(rng, t), _txid(rng), n).encode(), tuple(out.fields))

    return build


def _storage_append(rng: random.Random, t: FuzzTarget) -> Frame:
    head = _head(rng, t)
    first = min(_txid(rng), 2**63 - 16)  # room for the batch's consecutive IDs
    records = [
        Record(first + i, _req_id(rng, t), _int32(rng), _data(rng), _time_ms(rng))
        for i in range(rng.choice((0, 1, 1, 2, 3, rng.randrange(4, 16))))
    ]
    m = StorageAppendRequest(*head, RecordBatch.from_records(records))
    out = _storage_layout()
    out.add("Append.record count", 4, "length")
    for i, rec in enumerate(records):
        out.add(f"record[{i}].transaction_id", 8)
        for name in ("client_id", "generation", "partition_id", "seq"):
            out.add(f"record[{i}].{name}", 4)
        out.add(f"record[{i}].header", 4)
        out.add(f"record[{i}].data length", 4, "length")
        out.add(f"record[{i}].timestamp", 8)
        out.skip(len(rec.data))
        out.add(f"record[{i}].checksum", 4, "crc")
    return Frame("AppendRequest", m.encode(), tuple(out.fields))


Builder = Callable[[random.Random, FuzzTarget], Frame]

# Every client -> server request type, and every server -> storage request type.
CLIENT_BUILDERS: dict[str, Builder] = {
    "MountRequest": _mount,
    "AppendRequest": _client_append,
    "FeedRequest": _feed,
    "TransactionDataRequest": _transaction_data,
    "FlushRequest": _flush,
    "HighWaterMarkRequest": _high_water_mark,
    "ReadRangeRequest": _read_range,
    "AllocateClientIdRequest": _allocate_client_id,
    "FindTimeRequest": _find_time,
}
STORAGE_BUILDERS: dict[str, Builder] = {
    "OpenRequest": _open,
    "LastSessionInfoRequest": _no_body(LastSessionInfoRequest),
    "MaxTransactionIdRequest": _no_body(MaxTransactionIdRequest),
    "TruncateRequest": _one_txid(TruncateRequest, "Truncate.transaction_id"),
    "SetLowWaterMarkRequest": _one_txid(SetLowWaterMarkRequest, "SetLowWaterMark.low_water_mark"),
    "LogInfoRequest": _no_body(LogInfoRequest),
    "SetLogStartRequest": _one_txid(SetLogStartRequest, "SetLogStart.log_start"),
    "FindTimeRequest": _storage_find_time,
    "AppendRequest": _storage_append,
    "RecordHeaderRequest": _one_txid(RecordHeaderRequest, "RecordHeaderRequest.transaction_id"),
    "RecordRequest": _one_txid(RecordRequest, "RecordRequest.transaction_id"),
    "RecordHeaderListRequest": _list_read(RecordHeaderListRequest),
    "RecordListRequest": _list_read(RecordListRequest),
}
assert set(CLIENT_BUILDERS) == {c.__name__ for c in CLIENT_REQUESTS.values()}
assert set(STORAGE_BUILDERS) == {c.__name__ for c in STORAGE_REQUESTS.values()}
_BUILDERS = {
    "server": tuple(CLIENT_BUILDERS.values()),
    "storage": tuple(STORAGE_BUILDERS.values()),
}
# Message type codes a retyped frame may carry: this protocol's requests first, then
# responses and the other protocol's codes.
REQUEST_CODES = {
    "server": tuple(int(c) for c in CLIENT_REQUESTS),
    "storage": tuple(int(c) for c in STORAGE_REQUESTS),
}
OTHER_CODES = tuple(
    sorted({int(c) for c in ClientMessageType} | {int(c) for c in StorageMessageType})
)


def base_frame(rng: random.Random, t: FuzzTarget) -> Frame:
    """A valid request of a random type, with random (mostly plausible) fields."""
    return rng.choice(_BUILDERS[t.protocol])(rng, t)
