"""The pure core of ``waltz fuzz``: mutations of a valid frame.

Each mutation takes a ``Frame`` (``frames``) and a seeded ``random.Random`` and returns
the bytes to send instead: bit flips, inserted or deleted bytes, truncation, the frame
length or an inner count or length set to 0, -1 or huge, an integer field set to a
boundary value, a message retyped, spliced or given another type's field, a frame
repeated, random garbage. ``mutate`` picks one by weight.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable

from waltz_client.wire.framing import DEFAULT_MAX_FRAME_BYTES

from .frames import (
    INT32_EDGES,
    INT64_EDGES,
    OTHER_CODES,
    REQUEST_CODES,
    Field,
    Frame,
    FuzzTarget,
    base_frame,
)

UNOPENED_MAX_FRAME_BYTES = 64 * 1024  # the storage node's cap before a successful Open


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
    edges = INT64_EDGES if f.width == 8 else INT32_EDGES
    extra = (t.num_partitions, t.num_partitions - 1, rng.getrandbits(8 * f.width))
    return [_put(frame.data, f, rng.choice(edges + extra))]


def _retype(rng: random.Random, frame: Frame, t: FuzzTarget) -> list[bytes]:
    r = rng.random()
    if r < 0.5:
        code = rng.choice(REQUEST_CODES[t.protocol])
    elif r < 0.8:
        code = rng.choice(OTHER_CODES)
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
    mine = frame.data[f.offset : f.offset + f.width]
    # A donor holding the same value would change nothing: the session and sequence
    # fields of two frames of one connection often agree.
    donors = [
        g
        for g in other.fields[1:]
        if g.width == f.width and other.data[g.offset : g.offset + g.width] != mine
    ]
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
        junk = struct.pack(">IB", len(junk) + 1, rng.choice(REQUEST_CODES[t.protocol])) + junk
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
