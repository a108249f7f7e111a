"""``waltz fuzz``: structure-aware fuzzing of the daemons' binary protocols.

The core is pure and seeded. ``plan_connections`` turns a seed into connection plans:
for each connection, the bytes a peer sends (a valid handshake, and on storage a valid
Open, or a broken or missing one), then frames of every request type built with the
project's own encoders, some left valid and some mutated: bit flips, inserted or
deleted bytes, truncation, the frame length or an inner count or length set to 0, -1
or huge, an integer field set to a boundary value, a message retyped, spliced or given
another type's field, a frame repeated, random garbage. The same seed always gives the
same bytes; each connection has its own seed, so one connection can be replayed.

The thin asyncio shell (``fuzz_target``) sends the plans to a daemon over many
concurrent connections, discards what comes back, probes that the daemon still
answers a well-formed request, and records frames/s, refused and reset connections,
whether the process is alive and its RSS. ``waltz fuzz`` runs it against a throw-away
local cluster (a storage node and the server), then checks that a normal client
still appends and reads back.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import random
import ssl
import struct
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from waltz_client.runtime import event_loop
from waltz_client.runtime.tls import TlsFiles, build_context
from waltz_client.wire.client_messages import (
    CLIENT_REQUESTS,
    SERVER_PROTOCOL_VERSIONS,
    AllocateClientIdRequest,
    AppendRequest,
    ClientMessageType,
    FeedRequest,
    FlushRequest,
    HighWaterMarkRequest,
    MountRequest,
    ReadRangeRequest,
    TransactionDataRequest,
)
from waltz_client.wire.errors import describe
from waltz_client.wire.framing import (
    DEFAULT_MAX_FRAME_BYTES,
    HANDSHAKE_BYTES,
    MAGIC,
    Hello,
    Service,
)
from waltz_client.wire.records import Record, RecordBatch, ReqId
from waltz_client.wire.storage_messages import (
    STORAGE_PROTOCOL_VERSIONS,
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

from .fuzz_tls import capture_client_hello, mutate_client_hello

if TYPE_CHECKING:
    from .local.cluster import LocalCluster

PROTOCOLS = ("server", "storage")
UNOPENED_MAX_FRAME_BYTES = 64 * 1024  # the storage node's cap before a successful Open

# --- the pure core: valid frames with a map of their fields ---------------------------


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
    # A TLS port: a ClientHello its clients send (fuzz_tls.capture_client_hello). Some
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


_INT32_EDGES = (0, 1, -1, 2**31 - 1, -(2**31))
_INT64_EDGES = (0, 1, -1, -2, 2**31, 2**63 - 1, -(2**63))
_HWM_EDGES = tuple(v for v in _INT64_EDGES if v >= -1)


def _int32(rng: random.Random) -> int:
    return rng.choice(_INT32_EDGES) if rng.random() < 0.1 else rng.randrange(-(2**31), 2**31)


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
    return rng.choice(_INT64_EDGES)


def _session(rng: random.Random) -> int:
    """Small IDs may be a partition's current store session; the rest are not."""
    r = rng.random()
    if r < 0.5:
        return rng.randrange(-1, 8)
    if r < 0.8:
        return rng.randrange(0, 1 << 62)
    return rng.choice(_INT64_EDGES)


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
        Record(first + i, _req_id(rng, t), _int32(rng), _data(rng))
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
}
STORAGE_BUILDERS: dict[str, Builder] = {
    "OpenRequest": _open,
    "LastSessionInfoRequest": _no_body(LastSessionInfoRequest),
    "MaxTransactionIdRequest": _no_body(MaxTransactionIdRequest),
    "TruncateRequest": _one_txid(TruncateRequest, "Truncate.transaction_id"),
    "SetLowWaterMarkRequest": _one_txid(SetLowWaterMarkRequest, "SetLowWaterMark.low_water_mark"),
    "LogInfoRequest": _no_body(LogInfoRequest),
    "SetLogStartRequest": _one_txid(SetLogStartRequest, "SetLogStart.log_start"),
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
_CODES = {
    "server": tuple(int(c) for c in CLIENT_REQUESTS),
    "storage": tuple(int(c) for c in STORAGE_REQUESTS),
}
_OTHER_CODES = tuple(
    sorted({int(c) for c in ClientMessageType} | {int(c) for c in StorageMessageType})
)


def base_frame(rng: random.Random, t: FuzzTarget) -> Frame:
    """A valid request of a random type, with random (mostly plausible) fields."""
    return rng.choice(_BUILDERS[t.protocol])(rng, t)


# --- the pure core: mutations ---------------------------------------------------------


def _put(data: bytes, f: Field, value: int) -> bytes:
    """``data`` with ``value`` (two's complement, any sign) in field ``f``."""
    raw = (value & ((1 << (8 * f.width)) - 1)).to_bytes(f.width, "big")
    return data[: f.offset] + raw + data[f.offset + f.width :]


def _get(data: bytes, f: Field) -> int:
    return int.from_bytes(data[f.offset : f.offset + f.width], "big", signed=True)


def _bit_flip(rng: random.Random, frame: Frame, t: FuzzTarget) -> list[bytes]:
    out = bytearray(frame.data)
    for _ in range(rng.choice((1, 1, 2, 3, 8))):
        out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    return [bytes(out)]


def _byte_insert(rng: random.Random, frame: Frame, t: FuzzTarget) -> list[bytes]:
    at = rng.randrange(len(frame.data) + 1)
    return [frame.data[:at] + rng.randbytes(rng.randrange(1, 17)) + frame.data[at:]]


def _byte_delete(rng: random.Random, frame: Frame, t: FuzzTarget) -> list[bytes]:
    at = rng.randrange(len(frame.data))
    return [frame.data[:at] + frame.data[at + rng.randrange(1, 17) :]]


def _truncate(rng: random.Random, frame: Frame, t: FuzzTarget) -> list[bytes]:
    return [frame.data[: rng.randrange(len(frame.data))]]


def _frame_length(rng: random.Random, frame: Frame, t: FuzzTarget) -> list[bytes]:
    n = len(frame.data) - 4
    value = rng.choice(
        (
            0,
            -1,
            2**31 - 1,
            DEFAULT_MAX_FRAME_BYTES + 1,
            UNOPENED_MAX_FRAME_BYTES + 1,
            n - 1,
            n + 1,
            1,
            rng.randrange(2**32),
        )
    )
    return [_put(frame.data, frame.fields[0], value)]


def _inner_length(rng: random.Random, frame: Frame, t: FuzzTarget) -> list[bytes]:
    lengths = [f for f in frame.fields[1:] if f.kind == "length"]
    if not lengths:
        return _frame_length(rng, frame, t)
    f = rng.choice(lengths)
    v = _get(frame.data, f)
    value = rng.choice((0, -1, 2**31 - 1, -(2**31), v + 1, v - 1, 65_536, rng.randrange(2**32)))
    return [_put(frame.data, f, value)]


def _int_boundary(rng: random.Random, frame: Frame, t: FuzzTarget) -> list[bytes]:
    f = rng.choice(frame.fields[1:])
    if f.kind == "uuid":
        raw = rng.choice((b"\x00" * 16, b"\xff" * 16, rng.randbytes(16)))
        return [frame.data[: f.offset] + raw + frame.data[f.offset + 16 :]]
    edges = _INT64_EDGES if f.width == 8 else _INT32_EDGES
    extra = (t.num_partitions, t.num_partitions - 1, rng.getrandbits(8 * f.width))
    return [_put(frame.data, f, rng.choice(edges + extra))]


def _retype(rng: random.Random, frame: Frame, t: FuzzTarget) -> list[bytes]:
    r = rng.random()
    if r < 0.5:
        code = rng.choice(_CODES[t.protocol])
    elif r < 0.8:
        code = rng.choice(_OTHER_CODES)
    else:
        code = rng.randrange(256)
    return [frame.data[:4] + bytes((code,)) + frame.data[5:]]


def _splice(rng: random.Random, frame: Frame, t: FuzzTarget) -> list[bytes]:
    """This frame's head up to a field, another type's body from a field; the frame length
    fixed, so the framing holds and only the structure is wrong."""
    other = base_frame(rng, t)
    cut_a = rng.choice([f.offset for f in frame.fields[1:]] + [len(frame.data)])
    cut_b = rng.choice([f.offset for f in other.fields[1:]] + [len(other.data)])
    body = frame.data[4:cut_a] + other.data[cut_b:]
    return [struct.pack(">I", len(body)) + body]


def _transplant(rng: random.Random, frame: Frame, t: FuzzTarget) -> list[bytes]:
    """A field's value taken from the same-sized field of another message type."""
    other = base_frame(rng, t)
    f = rng.choice(frame.fields[1:])
    donors = [g for g in other.fields[1:] if g.width == f.width]
    if not donors:
        return _int_boundary(rng, frame, t)
    g = rng.choice(donors)
    raw = other.data[g.offset : g.offset + g.width]
    return [frame.data[: f.offset] + raw + frame.data[f.offset + f.width :]]


def _duplicate(rng: random.Random, frame: Frame, t: FuzzTarget) -> list[bytes]:
    return [frame.data] * rng.choice((2, 2, 3, 4, 16))


def _garbage(rng: random.Random, frame: Frame, t: FuzzTarget) -> list[bytes]:
    junk = rng.randbytes(rng.randrange(1, 4096))
    if rng.random() < 0.5:  # a plausible length, so the junk is parsed as a frame
        junk = struct.pack(">IB", len(junk) + 1, rng.choice(_CODES[t.protocol])) + junk
    return [junk]


Mutation = Callable[[random.Random, Frame, FuzzTarget], list[bytes]]
MUTATIONS: dict[str, tuple[Mutation, int]] = {  # name: (mutation, weight)
    "bit_flip": (_bit_flip, 12),
    "byte_insert": (_byte_insert, 6),
    "byte_delete": (_byte_delete, 6),
    "truncate": (_truncate, 5),
    "frame_length": (_frame_length, 8),
    "inner_length": (_inner_length, 14),
    "int_boundary": (_int_boundary, 16),
    "retype": (_retype, 8),
    "splice": (_splice, 7),
    "transplant": (_transplant, 7),
    "duplicate": (_duplicate, 3),
    "garbage": (_garbage, 6),
}
_MUTATION_NAMES = tuple(MUTATIONS)
_MUTATION_WEIGHTS = tuple(weight for _, weight in MUTATIONS.values())


def mutate(rng: random.Random, frame: Frame, t: FuzzTarget) -> tuple[str, list[bytes]]:
    """One mutation of ``frame``: its name and the bytes to send instead (several frames
    for a duplicate)."""
    name = rng.choices(_MUTATION_NAMES, _MUTATION_WEIGHTS)[0]
    return name, MUTATIONS[name][0](rng, frame, t)


# --- the pure core: connection plans --------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConnectionPlan:
    """Everything one fuzzing connection sends, and how it ends."""

    index: int
    seed: int  # plan_connection(target, seed, index) gives this plan again
    # "handshake", "open", "no-open", "bad-open", "none", "bad-hello"; on a TLS port also
    # "tls-stranger" (``raw`` instead of a TLS session) and "tls-no-cert" (no client cert)
    opening: str
    hello: bytes  # the 12-byte hello, a broken one, or nothing
    open_frame: bytes  # storage: the Open sent before the frames, or nothing
    await_replies: bool  # read the hello reply (and Open's answer) first, as a client does
    frames: tuple[bytes, ...]
    mutations: tuple[str, ...]  # per frame: the mutation, or "" for a valid frame
    fragment: bool  # send the first bytes a few at a time
    ending: str  # "eof", "close", "abort" or "linger"
    raw: bytes = b""  # tls-stranger: what is sent over plain TCP to the TLS port
    tls_mutation: str = ""  # tls-stranger: how ``raw`` was made of the ClientHello

    @property
    def stream(self) -> bytes:
        return self.raw or self.hello + self.open_frame + b"".join(self.frames)


def hello_for(t: FuzzTarget) -> bytes:
    """The hello a well-behaved peer of this protocol sends."""
    if t.protocol == "server":
        versions, service = SERVER_PROTOCOL_VERSIONS, Service.SERVER
    else:
        versions, service = STORAGE_PROTOCOL_VERSIONS, Service.STORAGE
    return Hello(service, versions.start, versions.stop - 1).encode()


def _bad_hello(rng: random.Random, t: FuzzTarget) -> bytes:
    good = hello_for(t)
    flipped = bytearray(good)
    flipped[rng.randrange(HANDSHAKE_BYTES)] ^= 1 << rng.randrange(8)
    wrong = Service.STORAGE if t.protocol == "server" else Service.SERVER
    return rng.choice(
        (
            b"WALT" + good[4:],
            Hello(wrong, 1, 1).encode(),
            Hello(Service(good[4]), 0, 0).encode(),
            Hello(Service(good[4]), 5, 9).encode(),
            Hello(Service(good[4]), 3, 1).encode(),  # an empty version range
            MAGIC + bytes((rng.randrange(3, 256),)) + good[5:],
            good[: rng.randrange(1, HANDSHAKE_BYTES)],  # short: the frames follow at once
            bytes(flipped),
        )
    )


def _opening(rng: random.Random, t: FuzzTarget) -> tuple[str, bytes, bytes]:
    r = rng.random()
    if r < 0.1:
        return "none", b"", b""
    if r < 0.2:
        return "bad-hello", _bad_hello(rng, t), b""
    hello = hello_for(t)
    if t.protocol == "server":
        return "handshake", hello, b""
    if r < 0.3:
        return "no-open", hello, b""
    if r < 0.35:  # a wrong key, or the right key with a wrong partition count
        guess = uuid.UUID(int=rng.getrandbits(128))
        bad = OpenRequest(-1, 1, -1, guess, t.num_partitions)
        if rng.random() < 0.5 and t.cluster_key is not None:
            bad = OpenRequest(-1, 1, -1, t.cluster_key, t.num_partitions + 1)
        return "bad-open", hello, bad.encode()
    return "open", hello, open_request(rng, t).data


_SESSION = struct.Struct(">q")
_LIVE_SESSIONS = range(0, 1 << 16)  # where a cluster's current store sessions are


def _stranger(frame: bytes) -> bytes:
    """A storage frame whose session ID (mutated or not) is moved far from any live
    session: the storage node answers it SESSION_UNKNOWN (or fenced), as it must a
    peer that does not know the partition's current session."""
    if len(frame) < 13:
        return frame
    (session,) = _SESSION.unpack_from(frame, 5)
    if session not in _LIVE_SESSIONS:
        return frame
    return frame[:5] + _SESSION.pack(session | 1 << 40) + frame[13:]


def plan_connection(t: FuzzTarget, seed: int, index: int = 0) -> ConnectionPlan:
    """One connection's plan, a function of ``seed`` alone."""
    rng = random.Random(seed)
    tls_opening = ""
    if t.tls_hello:  # extra draws only on a TLS port: plain plans stay as they were
        r = rng.random()
        if r < 0.25:
            return _tls_stranger(rng, t, seed, index)
        tls_opening = "tls-no-cert" if r < 0.3 else ""
    opening, hello, open_frame = _opening(rng, t)
    r = rng.random()
    count = 1 if r < 0.2 else rng.randrange(2, 16) if r < 0.7 else rng.randrange(16, 128)
    # Some connections stay mostly valid (to reach state deep in a session), some are
    # all mutations.
    rate = rng.choice((0.1, 0.3, 0.6, 1.0))
    frames: list[bytes] = []
    mutations: list[str] = []
    while len(frames) < count:
        frame = base_frame(rng, t)
        if rng.random() < rate:
            name, out = mutate(rng, frame, t)
            frames += out
            mutations += [name] * len(out)
        else:
            frames.append(frame.data)
            mutations.append("")
    if t.protocol == "storage" and not t.replay_sessions:
        frames = [_stranger(f) for f in frames]
    r = rng.random()
    ending = "eof" if r < 0.7 else "close" if r < 0.85 else "abort" if r < 0.95 else "linger"
    return ConnectionPlan(
        index,
        seed,
        tls_opening or opening,
        hello,
        open_frame,
        await_replies=not tls_opening and opening in ("handshake", "open") and rng.random() < 0.5,
        frames=tuple(frames),
        mutations=tuple(mutations),
        fragment=rng.random() < 0.1,
        ending=ending,
    )


def _tls_stranger(rng: random.Random, t: FuzzTarget, seed: int, index: int) -> ConnectionPlan:
    """A peer that sends a mutated ClientHello (or no TLS at all) to the TLS port."""
    name, raw = mutate_client_hello(rng, t.tls_hello, hello_for(t))
    r = rng.random()
    ending = "eof" if r < 0.5 else "close" if r < 0.7 else "abort" if r < 0.9 else "linger"
    return ConnectionPlan(
        index,
        seed,
        "tls-stranger",
        b"",
        b"",
        await_replies=False,
        frames=(),
        mutations=(),
        fragment=rng.random() < 0.2,
        ending=ending,
        raw=raw,
        tls_mutation=name,
    )


def plan_connections(t: FuzzTarget, seed: int, total_frames: int) -> Iterator[ConnectionPlan]:
    """Plans until ``total_frames`` frames are planned (the last plan cut to fit)."""
    master = random.Random(seed)
    planned = 0
    index = 0
    while planned < total_frames:
        plan = plan_connection(t, master.getrandbits(64), index)
        left = total_frames - planned
        if len(plan.frames) > left:
            plan = replace(plan, frames=plan.frames[:left], mutations=plan.mutations[:left])
        planned += len(plan.frames)
        index += 1
        yield plan


# --- the process: alive, RSS ----------------------------------------------------------


def process_alive(pid: int) -> bool:
    """False once ``pid`` has exited (a zombie counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
        return state not in ("Z", "X")
    except FileNotFoundError:
        return False
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def proc_status_kib(pid: int, key: str = "VmRSS") -> int | None:
    """A ``/proc/<pid>/status`` figure in KiB (VmRSS, VmHWM), or None."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


# --- the asyncio shell ----------------------------------------------------------------

CONNECT_TIMEOUT = 5.0
WRITE_TIMEOUT = 10.0  # a daemon applying back pressure may stop reading for a while
PROBE_TIMEOUT = 10.0
PROBE_FAILURES_TO_STOP = 3


@dataclass(frozen=True, slots=True)
class TlsDial:
    """How the fuzzer dials a TLS port: as a peer with a certificate the daemon accepts
    (so frames reach the protocol behind TLS), and as one without a certificate."""

    context: ssl.SSLContext
    anonymous: ssl.SSLContext
    server_hostname: str

    @classmethod
    def of(cls, files: TlsFiles, server_hostname: str) -> TlsDial:
        return cls(
            build_context(files, listening=False),
            build_context(TlsFiles(ca=files.ca), listening=False),
            server_hostname,
        )

    def client_hello(self) -> bytes:
        return capture_client_hello(self.context, self.server_hostname)


@dataclass(frozen=True, slots=True)
class Endpoint:
    name: str
    host: str
    port: int
    pid: int | None = None
    alive: Callable[[], bool] | None = None  # default: /proc/<pid>
    tls: TlsDial | None = None  # the port speaks TLS

    def is_alive(self) -> bool | None:
        if self.alive is not None:
            return self.alive()
        return process_alive(self.pid) if self.pid is not None else None


@dataclass
class FuzzStats:
    name: str
    protocol: str
    address: str
    pid: int | None
    seed: int
    num_partitions: int
    frames: int = 0  # written to the socket (the daemon may have closed it already)
    mutated: int = 0
    unsent: int = 0  # planned, but the connection failed before they were written
    bytes_sent: int = 0
    bytes_received: int = 0
    connections: int = 0
    refused: int = 0  # connect refused or failed
    reset: int = 0  # reset or broken pipe
    write_stalls: int = 0  # the daemon did not take our bytes within WRITE_TIMEOUT
    close_timeouts: int = 0  # the daemon kept the connection open past our EOF
    tls_strangers: int = 0  # mutated ClientHellos (or plain text) sent to a TLS port
    tls_no_cert: int = 0  # TLS connections without a client certificate
    seconds: float = 0.0
    probes: int = 0
    probe_failures: int = 0
    probe_max_seconds: float = 0.0
    answered_after: bool | None = None  # the final probe
    alive_after: bool | None = None
    rss_before_kib: int | None = None
    rss_after_kib: int | None = None
    peak_rss_kib: int | None = None  # VmHWM: the highest since the daemon started
    stopped: str = ""  # why the run stopped early
    suspects: list[tuple[int, int]] = field(default_factory=list)  # (index, seed)
    mutation_counts: collections.Counter[str] = field(default_factory=collections.Counter)

    @property
    def frames_per_s(self) -> float:
        return self.frames / self.seconds if self.seconds > 0 else 0.0

    @property
    def failed(self) -> bool:
        return self.alive_after is False or self.answered_after is False


async def _discard(reader: asyncio.StreamReader, stats: FuzzStats) -> None:
    """Read until the daemon closes; what it says is not checked (it must not crash)."""
    with contextlib.suppress(OSError):
        while True:
            data = await reader.read(256 * 1024)
            if not data:
                return
            stats.bytes_received += len(data)


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (length,) = struct.unpack(">I", await reader.readexactly(4))
    if not 0 < length <= 1024 * 1024:
        raise ConnectionError(f"reply frame length {length}")
    return await reader.readexactly(length)


async def _send(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(data)
    await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT)


def _dial(host: str, port: int, plan: ConnectionPlan, tls: TlsDial | None) -> Any:
    if tls is None or plan.opening == "tls-stranger":
        return asyncio.open_connection(host, port)
    context = tls.anonymous if plan.opening == "tls-no-cert" else tls.context
    return asyncio.open_connection(host, port, ssl=context, server_hostname=tls.server_hostname)


async def run_connection(
    host: str,
    port: int,
    plan: ConnectionPlan,
    stats: FuzzStats,
    reply_timeout: float,
    tls: TlsDial | None = None,
) -> None:
    """Send one plan; count what happened. Never raises for what the daemon does."""
    try:
        reader, writer = await asyncio.wait_for(_dial(host, port, plan, tls), CONNECT_TIMEOUT)
    except (OSError, TimeoutError, ssl.SSLError):  # ssl.SSLError: the handshake refused
        stats.refused += 1
        stats.unsent += len(plan.frames)
        return
    stats.connections += 1
    stats.tls_strangers += plan.opening == "tls-stranger"
    stats.tls_no_cert += plan.opening == "tls-no-cert"
    sink: asyncio.Task[None] | None = None
    sent = False
    try:
        rest = plan.stream
        if plan.await_replies:
            await _send(writer, plan.hello)
            await asyncio.wait_for(reader.readexactly(HANDSHAKE_BYTES), PROBE_TIMEOUT)
            if plan.open_frame:
                await _send(writer, plan.open_frame)
                await asyncio.wait_for(_read_frame(reader), PROBE_TIMEOUT)
            rest = b"".join(plan.frames)
        sink = asyncio.ensure_future(_discard(reader, stats))
        if plan.fragment:  # the hello and the first frame's head a few bytes at a time
            head, rest = rest[:48], rest[48:]
            for i in range(0, len(head), 3):
                await _send(writer, head[i : i + 3])
                await asyncio.sleep(0)
        await _send(writer, rest)
        sent = True
        if plan.ending == "eof":
            writer.write_eof()
            try:
                await asyncio.wait_for(asyncio.shield(sink), reply_timeout)
            except TimeoutError:
                stats.close_timeouts += 1
        elif plan.ending == "linger":
            await asyncio.wait({sink}, timeout=reply_timeout)
        elif plan.ending == "close":
            writer.close()  # a FIN without waiting for anything
    except TimeoutError:
        stats.write_stalls += 1
    except (OSError, asyncio.IncompleteReadError):
        stats.reset += 1
    except RuntimeError:  # uvloop: a write on a transport the daemon's reset closed
        stats.reset += 1
    finally:
        if sink is not None:
            sink.cancel()
        if not writer.is_closing():
            writer.transport.abort()  # a reset: no close handshake to wait for
    if sent:
        stats.frames += len(plan.frames)
        stats.mutated += sum(1 for m in plan.mutations if m)
        stats.bytes_sent += len(plan.stream)
        stats.mutation_counts.update(m for m in plan.mutations if m)
        if plan.tls_mutation:
            stats.mutation_counts[f"tls {plan.tls_mutation}"] += 1
    else:
        stats.unsent += len(plan.frames)


async def probe(
    host: str,
    port: int,
    t: FuzzTarget,
    timeout: float = PROBE_TIMEOUT,
    tls: TlsDial | None = None,
) -> float:
    """Seconds a well-formed request takes to be answered (any answer); raises if none.
    Storage: Open, then a partition request (answered by the partition's worker thread);
    server: a high-water mark request (answered by the partition or as not owned)."""
    started = time.perf_counter()

    async def exchange() -> None:
        if tls is None:
            reader, writer = await asyncio.open_connection(host, port)
        else:
            reader, writer = await asyncio.open_connection(
                host, port, ssl=tls.context, server_hostname=tls.server_hostname
            )
        try:
            writer.write(hello_for(t))
            reply = await reader.readexactly(HANDSHAKE_BYTES)
            if reply[:4] != MAGIC or reply[4] != 0:
                raise ConnectionError(f"handshake refused: {reply!r}")
            if t.protocol == "storage":
                writer.write(open_request(random.Random(0), t).data)
                await _read_frame(reader)
                writer.write(LastSessionInfoRequest(-1, 2, 0).encode())
            else:
                writer.write(HighWaterMarkRequest(ReqId(0, -1, 0, 1)).encode())
            await _read_frame(reader)
        finally:
            writer.transport.abort()

    await asyncio.wait_for(exchange(), timeout)
    return time.perf_counter() - started


async def fuzz_target(
    endpoint: Endpoint,
    target: FuzzTarget,
    *,
    seed: int,
    frames: int,
    concurrency: int = 16,
    reply_timeout: float = 0.5,
    probe_interval: float = 1.0,
    progress: Callable[[FuzzStats], None] | None = None,
) -> FuzzStats:
    """Send ``frames`` planned frames to ``endpoint`` over ``concurrency`` connections at a
    time; stop early if the daemon exits or stops answering probes."""
    host, port = endpoint.host, endpoint.port
    stats = FuzzStats(
        endpoint.name, target.protocol, f"{host}:{port}", endpoint.pid, seed, target.num_partitions
    )
    if endpoint.pid is not None:
        stats.rss_before_kib = proc_status_kib(endpoint.pid)
    plans = plan_connections(target, seed, frames)
    in_flight: dict[int, int] = {}
    recent: collections.deque[tuple[int, int]] = collections.deque(maxlen=16)
    done = asyncio.Event()

    def stop(reason: str) -> None:
        if not stats.stopped:
            stats.stopped = reason
            # The connections that may have done it: those under way, and the last few.
            stats.suspects = sorted(in_flight.items()) + list(recent)
        done.set()

    async def worker() -> None:
        for plan in plans:
            if done.is_set():
                return
            in_flight[plan.index] = plan.seed
            try:
                await run_connection(host, port, plan, stats, reply_timeout, endpoint.tls)
            finally:
                del in_flight[plan.index]
                recent.append((plan.index, plan.seed))

    async def watch() -> None:
        failures = 0
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), probe_interval)
            if done.is_set():
                return
            if endpoint.is_alive() is False:
                stop("the daemon exited")
                return
            stats.probes += 1
            try:
                seconds = await probe(host, port, target, tls=endpoint.tls)
                stats.probe_max_seconds = max(stats.probe_max_seconds, seconds)
                failures = 0
            except (OSError, TimeoutError, asyncio.IncompleteReadError, ConnectionError):
                stats.probe_failures += 1
                failures += 1
                if endpoint.is_alive() is False:
                    stop("the daemon exited")
                elif failures >= PROBE_FAILURES_TO_STOP:
                    stop(f"no answer to {failures} probes in a row (a hang?)")
            if progress is not None:
                progress(stats)

    started = time.perf_counter()
    watcher = asyncio.ensure_future(watch())
    await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    stats.seconds = time.perf_counter() - started
    done.set()
    await watcher
    if endpoint.is_alive() is False:
        stop("the daemon exited")
    stats.alive_after = endpoint.is_alive()
    if stats.alive_after is not False:
        try:
            await probe(host, port, target, tls=endpoint.tls)
            stats.answered_after = True
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            stats.answered_after = False
    if endpoint.pid is not None:
        stats.rss_after_kib = proc_status_kib(endpoint.pid)
        stats.peak_rss_kib = proc_status_kib(endpoint.pid, "VmHWM")
    return stats


# --- a well-behaved client afterwards -------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClientCheck:
    ok: bool
    committed: int
    read_back: int
    detail: str


async def check_client(
    zookeeper: str,
    zk_root: str,
    transactions: int = 8,
    timeout: float = 60.0,
    *,
    tls: TlsFiles | None = None,
    zk_tls: TlsFiles | None = None,
) -> ClientCheck:
    """Append ``transactions`` transactions through the client library, spread over the
    partitions, and read each back (its data, and a range read). A healthy cluster
    takes well under a second; ``timeout`` only bounds a cluster that does not serve."""
    from waltz_client.client import WaltzClient
    from waltz_client.config import WaltzClientConfig
    from waltz_client.transaction import TransactionBuilder, TransactionContext

    class Put(TransactionContext):
        def __init__(self, partition: int, data: bytes) -> None:
            self.partition, self.data = partition, data

        def partition_id(self, num_partitions: int) -> int:
            return self.partition

        def execute(self, builder: TransactionBuilder) -> bool:
            builder.set_header(len(self.data))
            builder.set_data(self.data)
            return True

    config = WaltzClientConfig(
        zookeeper, zk_root=zk_root, feed=False, max_retries=200, tls=tls, zk_tls=zk_tls
    )
    nonce = uuid.uuid4().hex

    async def run() -> ClientCheck:
        async with WaltzClient(config) as client:
            n = client.num_partitions
            puts = [Put(i % n, f"fuzz check {nonce} {i}".encode()) for i in range(transactions)]
            tasks = [asyncio.ensure_future(client.submit(p)) for p in puts]
            _, pending = await asyncio.wait(tasks, timeout=timeout)
            for task in pending:
                task.cancel()
            # Which partitions did not serve says more than a timeout.
            stuck = sorted(
                {put.partition for put, t in zip(puts, tasks, strict=True) if t in pending}
            )
            if stuck:
                return ClientCheck(
                    False,
                    len(tasks) - len(pending),
                    0,
                    f"partitions {stuck}: not committed within {timeout:g} s",
                )
            results = [t.result() for t in tasks]
            failed = [r.reason for r in results if not r.committed]
            if failed:
                return ClientCheck(False, transactions - len(failed), 0, f"not committed: {failed}")
            read = 0
            for put, result in zip(puts, results, strict=True):
                txid = result.transaction_id
                data = await client.transaction_data(put.partition, txid)
                ranged = [r.data async for r in client.read(put.partition, txid, txid)]
                if data != put.data or ranged != [put.data]:
                    return ClientCheck(
                        False,
                        transactions,
                        read,
                        f"partition {put.partition} transaction {txid}: read back "
                        f"{data!r} / {ranged!r}, appended {put.data!r}",
                    )
                read += 1
            return ClientCheck(True, transactions, read, f"on {n} partitions")

    try:
        return await asyncio.wait_for(run(), 2 * timeout)  # reads have their own timeouts
    except Exception as e:  # the check's verdict, whatever broke
        return ClientCheck(False, 0, 0, f"{type(e).__name__}: {describe(e)}")


# --- a whole local cluster -------------------------------------------------------------

_LOG_ALARMS = ("Traceback", " ERROR ", " CRITICAL ")


@dataclass
class ClusterFuzzResult:
    stats: list[FuzzStats]
    check: ClientCheck
    dead: list[str]  # daemons of the cluster that exited
    logged_errors: dict[str, list[str]]  # daemon: error lines it logged while fuzzed

    @property
    def ok(self) -> bool:
        return not self.dead and self.check.ok and not any(s.failed for s in self.stats)


def _log_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _new_error_lines(path: str, offset: int) -> list[str]:
    """Error lines (and tracebacks) a daemon logged after ``offset``: not fatal, but an
    exception the fuzzer provoked is a finding."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if any(a in line for a in _LOG_ALARMS)]


async def fuzz_cluster(
    cluster: LocalCluster,
    *,
    frames: int,
    seed: int,
    concurrency: int = 16,
    reply_timeout: float = 0.5,
    client_transactions: int = 8,
    replay_sessions: bool = True,
    announce: Callable[[str], None] = lambda line: None,
) -> ClusterFuzzResult:
    """Fuzz a started local cluster's first storage node, then its first server, then
    check that a client of the cluster appends and reads back. ``replay_sessions``: see
    ``FuzzTarget``. On a TLS cluster the fuzzer dials storage with the admin certificate
    and the server with the client's, and also sends mutated handshakes."""
    from .local.cluster import ADMIN_IDENTITY

    assert cluster.created is not None, "start the cluster first"
    num_partitions = cluster.layout.partitions
    key = cluster.created.params.key
    storage_tls = server_tls = None
    if cluster.pki is not None and cluster.client_tls is not None:
        storage_tls = TlsDial.of(cluster.pki[ADMIN_IDENTITY], "127.0.0.1")
        server_tls = TlsDial.of(cluster.client_tls, "127.0.0.1")
    runs = [
        (
            cluster.storages[0],
            storage_tls,
            FuzzTarget("storage", num_partitions, key, replay_sessions),
        ),
        (cluster.servers[0], server_tls, FuzzTarget("server", num_partitions)),
    ]
    daemons = [*cluster.storages, *cluster.servers]
    offsets = {d.name: _log_size(d.log_path) for d in daemons}
    results: list[FuzzStats] = []
    for proc, tls, target in runs:
        if tls is not None:
            target = replace(target, tls_hello=tls.client_hello())
        endpoint = Endpoint(
            proc.name,
            "127.0.0.1",
            int(proc.ready["port"]),
            proc.pid,
            alive=lambda proc=proc: proc.running,
            tls=tls,
        )
        announce(f"fuzzing {proc.name} (pid {proc.pid}): {frames:,} frames, seed {seed}")
        stats = await fuzz_target(
            endpoint,
            target,
            seed=seed,
            frames=frames,
            concurrency=concurrency,
            reply_timeout=reply_timeout,
            progress=_every_ten_probes(announce),
        )
        results.append(stats)
        announce("\n".join(describe_stats(stats)))
    check = await check_client(
        cluster.zookeeper_connect,
        cluster.layout.root,
        client_transactions,
        tls=cluster.client_tls,
        zk_tls=cluster.client_zk_tls,
    )
    errors = {d.name: _new_error_lines(d.log_path, offsets[d.name]) for d in daemons}
    return ClusterFuzzResult(
        results,
        check,
        [d.name for d in daemons if not d.running],
        {name: lines for name, lines in errors.items() if lines},
    )


# --- reporting ------------------------------------------------------------------------


def _mib(kib: int | None) -> str:
    return "?" if kib is None else f"{kib / 1024:,.1f} MiB"


def describe_stats(s: FuzzStats) -> list[str]:
    alive = {True: "alive", False: "EXITED", None: "alive: unknown (no pid)"}[s.alive_after]
    answered = {True: "answers", False: "DOES NOT ANSWER", None: "not probed"}[s.answered_after]
    lines = [
        f"{s.name} ({s.protocol} protocol, {s.address}): {s.frames:,} frames "
        f"({s.mutated:,} mutated, {s.bytes_sent / 1e6:,.1f} MB) in {s.seconds:.1f} s: "
        f"{s.frames_per_s:,.0f} frames/s over {s.connections:,} connections"
        + (
            f" ({s.tls_strangers:,} with a mutated TLS handshake, {s.tls_no_cert:,} "
            f"without a client certificate)"
            if s.tls_strangers or s.tls_no_cert
            else ""
        ),
        f"  {s.unsent:,} frames not written (the daemon had closed the connection); "
        f"connections refused {s.refused:,}, reset {s.reset:,}, writes stalled "
        f"{s.write_stalls:,}, kept open past our EOF {s.close_timeouts:,}; probes "
        f"{s.probes - s.probe_failures}/{s.probes} answered (slowest "
        f"{s.probe_max_seconds:.2f} s)",
        f"  after: {alive}, {answered}; RSS {_mib(s.rss_before_kib)} -> "
        f"{_mib(s.rss_after_kib)} (peak {_mib(s.peak_rss_kib)})",
    ]
    if s.stopped:
        lines.append(f"  STOPPED: {s.stopped} (seed {s.seed})")
        replay = (
            f"waltz fuzz --target {s.address} --protocol {s.protocol} "
            f"--num-partitions {s.num_partitions}"
            + (" --cluster-key KEY" if s.protocol == "storage" else "")
        )
        lines.append(f"  suspect connections (under way, then the last ones): {replay} --replay")
        lines += [f"    #{index}: {seed}" for index, seed in s.suspects]
    return lines


# --- the command ----------------------------------------------------------------------


def register(groups: argparse._SubParsersAction) -> None:
    p = groups.add_parser(
        "fuzz",
        help="fuzz the storage and server protocols, then check a client is served",
        description="Send mutated frames to a storage node and a server (a throw-away "
        "local cluster by default, or --target), report frames/s, crashes and RSS, then "
        "check that a well-behaved client still appends and reads back. Exit status 1 if "
        "a daemon exited or stopped answering, or the client check failed.",
    )
    p.add_argument("--frames", type=int, default=1_000_000, help="per daemon (default 1e6)")
    p.add_argument("--seed", type=int, default=1, help="the same seed sends the same bytes")
    p.add_argument("--concurrency", type=int, default=16, help="connections at once")
    p.add_argument("--reply-timeout", type=float, default=0.5, help="seconds to wait for replies")
    p.add_argument("--data-dir", default=".waltz-local/fuzz", help="local cluster; wiped")
    p.add_argument("--partitions", type=int, default=4, help="local cluster (default 4)")
    p.add_argument(
        "--insecure",
        action="store_true",
        help="local cluster in plain text (default: mutual TLS, and mutated TLS handshakes)",
    )
    p.add_argument("--target", metavar="HOST:PORT", help="fuzz this running daemon instead")
    p.add_argument("--protocol", choices=PROTOCOLS, help="with --target: what it speaks")
    p.add_argument("--pid", type=int, help="with --target: its process, for alive and RSS")
    p.add_argument("--zookeeper", help="with --target: the cluster's ZooKeeper (key, client)")
    p.add_argument("--zk-root", default="/waltz", help="with --zookeeper (default /waltz)")
    p.add_argument("--cluster-key", type=uuid.UUID, help="with --target storage: for Open")
    p.add_argument("--num-partitions", type=int, help="with --target: partitions to aim at")
    p.add_argument("--tls-cert", help="with --target: the port speaks TLS; dial with this cert")
    p.add_argument("--tls-key", help="with --tls-cert: its key")
    p.add_argument("--tls-ca", help="with --target: the CA the daemon's certificate chains to")
    p.add_argument("--tls-server-name", help="with --tls-ca: the name to check (default HOST)")
    p.add_argument(
        "--no-replay-sessions",
        dest="replay_sessions",
        action="store_false",
        help="storage: never send a live session ID (a stranger, not a peer reading ZooKeeper)",
    )
    p.add_argument(
        "--replay", type=int, metavar="CONNECTION_SEED", help="send one suspect connection"
    )
    p.set_defaults(func=cmd_fuzz)


def _every_ten_probes(announce: Callable[[str], None]) -> Callable[[FuzzStats], None]:
    """A progress line every ten probes (about ten seconds)."""

    def progress(stats: FuzzStats) -> None:
        if stats.probes % 10 == 0:
            announce(f"  ... {stats.name}: {stats.frames:,} frames")

    return progress


def cmd_fuzz(args: argparse.Namespace) -> int:
    if args.frames < 1 or args.concurrency < 1 or args.partitions < 1:
        print("waltz fuzz: error: --frames, --concurrency and --partitions must be at least 1")
        return 2
    if args.target is not None:
        return _cmd_target(args)
    if args.protocol or args.pid or args.replay is not None:
        print("waltz fuzz: error: --protocol, --pid and --replay need --target")
        return 2
    return _cmd_local(args)


def _cmd_local(args: argparse.Namespace) -> int:
    from .demo.common import fresh_cluster

    cluster = fresh_cluster(args.data_dir, args.partitions, 1, [], tls=not args.insecure)
    print(
        f"starting a local cluster: 3 storage nodes, 1 server, {args.partitions} partitions, "
        + ("plain text" if args.insecure else "mutual TLS")
    )
    cluster.start()
    try:
        result = event_loop.run(
            fuzz_cluster(
                cluster,
                frames=args.frames,
                seed=args.seed,
                concurrency=args.concurrency,
                reply_timeout=args.reply_timeout,
                replay_sessions=args.replay_sessions,
                announce=lambda line: print(line, flush=True),
            )
        )
    finally:
        cluster.stop()
    for name, lines in result.logged_errors.items():
        print(f"{name} logged {len(lines)} error line(s) while fuzzed; the first:")
        print("\n".join(f"  {line}" for line in lines[:5]))
    if not result.check.ok:  # why the client was not served is in the server's log
        for proc in cluster.servers:
            tail = [line for line in proc.log_tail(400).splitlines() if "closing" not in line]
            print(f"{proc.name} log, the last lines (peer warnings left out):")
            print("\n".join(f"  {line}" for line in tail[-6:]))
    return _verdict(result.stats, result.check, result.dead)


def _verdict(results: list[FuzzStats], check: ClientCheck | None, dead: list[str]) -> int:
    if check is None:
        print("well-behaved client: not checked (no --zookeeper)")
    else:
        verdict = "served" if check.ok else "FAILED"
        print(
            f"well-behaved client: {verdict}: {check.committed} appended, "
            f"{check.read_back} read back ({check.detail})"
        )
    if dead:
        print(f"daemons that exited: {', '.join(dead)}")
    ok = not dead and not any(s.failed for s in results) and (check is None or check.ok)
    print(f"result: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def _cmd_target(args: argparse.Namespace) -> int:
    if args.protocol is None:
        print("waltz fuzz: error: --target needs --protocol server|storage")
        return 2
    host, _, port = args.target.rpartition(":")
    if not host or not port.isdigit():
        print(f"waltz fuzz: error: --target {args.target!r}: expected HOST:PORT")
        return 2
    key, partitions = args.cluster_key, args.num_partitions
    if args.zookeeper:
        from waltz_client.cluster.admin import read_params
        from waltz_client.cluster.zk import close, connect

        zk = connect(args.zookeeper)
        try:
            params = read_params(zk, args.zk_root)
        finally:
            close(zk)
        key = key or params.key
        partitions = partitions or params.num_partitions
    tls, files = None, None
    if args.tls_ca or args.tls_cert:
        files = TlsFiles(args.tls_cert, args.tls_key, args.tls_ca)
        try:
            files.check("tls", listening=False)
            tls = TlsDial.of(files, args.tls_server_name or host)
        except (ValueError, OSError, ssl.SSLError) as e:
            # "setting tls_ca: ..." names the daemons' setting; here it is the flag
            flag = str(e).replace("setting tls_", "--tls-").replace(" tls_", " --tls-")
            print(f"waltz fuzz: error: {flag}")
            return 2
    target = FuzzTarget(
        args.protocol,
        partitions or 4,
        key,
        args.replay_sessions,
        tls_hello=tls.client_hello() if tls is not None else b"",
    )
    endpoint = Endpoint(args.target, host, int(port), args.pid, tls=tls)
    if args.replay is not None:
        return _replay(endpoint, target, args)
    print(
        f"fuzzing {args.target} ({args.protocol}, pid {args.pid or 'unknown'}): "
        f"{args.frames:,} frames, seed {args.seed}",
        flush=True,
    )
    stats = event_loop.run(
        fuzz_target(
            endpoint,
            target,
            seed=args.seed,
            frames=args.frames,
            concurrency=args.concurrency,
            reply_timeout=args.reply_timeout,
            progress=_every_ten_probes(lambda line: print(line, flush=True)),
        )
    )
    print("\n".join(describe_stats(stats)))
    # The client check dials servers: with the --tls-* files when they are a client's.
    client_tls = files if tls is not None and args.protocol == "server" else None
    check = (
        event_loop.run(check_client(args.zookeeper, args.zk_root, tls=client_tls))
        if args.zookeeper
        else None
    )
    return _verdict([stats], check, [args.target] if stats.alive_after is False else [])


def _replay(endpoint: Endpoint, target: FuzzTarget, args: argparse.Namespace) -> int:
    plan = plan_connection(target, args.replay)
    print(
        f"connection seed {args.replay}: opening {plan.opening}, {len(plan.frames)} frames, "
        f"ending {plan.ending}"
    )
    if plan.raw:  # the ClientHello it mutates is captured afresh: the same shape, new random
        print(f"  tls {plan.tls_mutation:>8} {plan.raw[:48].hex()}{'...' * (len(plan.raw) > 48)}")
    for frame, mutation in zip(plan.frames, plan.mutations, strict=True):
        print(f"  {mutation or 'valid':>12} {frame[:48].hex()}{'...' if len(frame) > 48 else ''}")

    async def once() -> FuzzStats:
        stats = FuzzStats(
            endpoint.name,
            target.protocol,
            args.target,
            args.pid,
            args.replay,
            target.num_partitions,
        )
        await run_connection(
            endpoint.host, endpoint.port, plan, stats, args.reply_timeout, endpoint.tls
        )
        await asyncio.sleep(1.0)  # a crash takes a moment to show
        stats.alive_after = endpoint.is_alive()
        try:
            await probe(endpoint.host, endpoint.port, target, tls=endpoint.tls)
            stats.answered_after = True
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            stats.answered_after = False
        return stats

    stats = event_loop.run(once())
    print(f"after: alive {stats.alive_after}, answers {stats.answered_after}")
    return 1 if stats.failed else 0
