"""The pure core of ``waltz fuzz``: connection plans, a function of a seed.

``plan_connections`` turns a seed into connection plans: for each connection, the bytes
a peer sends (a valid handshake, and on storage a valid Open, or a broken or missing
one), then frames (``frames``), some left valid and some mutated (``mutations``), and
how the connection ends. On a TLS port some connections are strangers that send a
mutated ClientHello (``tls``) or handshake without a client certificate. Each
connection has its own seed, so one connection can be replayed (``plan_connection``).
"""

from __future__ import annotations

import random
import struct
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace

from waltz_client.wire.client_messages import SERVER_PROTOCOL_VERSIONS
from waltz_client.wire.framing import HANDSHAKE_BYTES, MAGIC, Hello, Service
from waltz_client.wire.storage_messages import STORAGE_PROTOCOL_VERSIONS, OpenRequest

from .frames import FuzzTarget, base_frame, open_request
from .mutations import mutate
from .tls import mutate_client_hello


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
