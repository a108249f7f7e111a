"""The TLS half of ``waltz fuzz``: what a stranger sends to a port that speaks TLS.

A TLS port is first of all a TLS handshake parser (OpenSSL's, driven by asyncio's SSL
protocol, with our deadlines and caps around it). The fuzzer starts from a real
ClientHello, captured once from the client context it would use (``capture_client_hello``),
and mutates it the way the frame mutations (``mutations``) mutate frames: bit flips,
truncation, the record's or the handshake's length set to a boundary, a wrong
content type or record version, the hello split over many records, oversized records,
an SSLv2-style header, a plain-text Waltz hello on the TLS port, garbage. The core is
pure: the same hello and seed give the same bytes.
"""

from __future__ import annotations

import contextlib
import random
import ssl
import struct
from collections.abc import Callable
from dataclasses import dataclass

RECORD_HEADER_BYTES = 5
CONTENT_HANDSHAKE = 0x16
MAX_RECORD_BYTES = 2**14 + 2048  # the largest TLS ciphertext record (RFC 8446, 5.2)


def capture_client_hello(context: ssl.SSLContext, server_hostname: str | None) -> bytes:
    """The first flight ``context`` sends when it dials: one ClientHello record."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_hostname)
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    hello = outgoing.read()
    if len(hello) < RECORD_HEADER_BYTES or hello[0] != CONTENT_HANDSHAKE:
        raise ValueError("the context did not start with a TLS handshake record")
    return hello


@dataclass(frozen=True, slots=True)
class HelloField:
    """A field of a ClientHello record: where it is, how wide, what it says."""

    offset: int
    width: int  # bytes, big-endian
    name: str


def hello_fields(hello: bytes) -> tuple[HelloField, ...]:
    """The length and type fields of a ClientHello record, as far as ``hello`` holds them
    (RFC 8446, 4.1.2): a mutation aims at these to reach the parser's length checks."""
    fields = [
        HelloField(0, 1, "content type"),
        HelloField(1, 2, "record version"),
        HelloField(3, 2, "record length"),
        HelloField(5, 1, "handshake type"),
        HelloField(6, 3, "handshake length"),
        HelloField(9, 2, "client version"),
    ]
    pos = 9 + 2 + 32  # after the version and the 32-byte random
    for name, width in (
        ("session id length", 1),
        ("cipher suites length", 2),
        ("compression methods length", 1),
    ):
        if pos + width > len(hello):
            return tuple(fields)
        fields.append(HelloField(pos, width, name))
        pos += width + int.from_bytes(hello[pos : pos + width], "big")
    if pos + 2 <= len(hello):
        fields.append(HelloField(pos, 2, "extensions length"))
    return tuple(fields)


def _put(data: bytes, f: HelloField, value: int) -> bytes:
    value %= 1 << (8 * f.width)
    return data[: f.offset] + value.to_bytes(f.width, "big") + data[f.offset + f.width :]


def _bit_flip(rng: random.Random, hello: bytes, plain_hello: bytes) -> bytes:
    out = bytearray(hello)
    for _ in range(rng.randrange(1, 9)):
        out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    return bytes(out)


def _truncate(rng: random.Random, hello: bytes, plain_hello: bytes) -> bytes:
    return hello[: rng.randrange(1, len(hello))]


def _field(rng: random.Random, hello: bytes, plain_hello: bytes) -> bytes:
    f = rng.choice(hello_fields(hello))
    current = int.from_bytes(hello[f.offset : f.offset + f.width], "big")
    top = (1 << (8 * f.width)) - 1
    values = {0, 1, top, top - 1, (current + 1) & top, (current - 1) & top} - {current}
    return _put(hello, f, rng.choice(sorted(values)))


def _content_type(rng: random.Random, hello: bytes, plain_hello: bytes) -> bytes:
    kind = rng.choice((0x14, 0x15, 0x17, 0x18, 0x00, rng.randrange(256)))
    return bytes((kind,)) + hello[1:]


def _record_version(rng: random.Random, hello: bytes, plain_hello: bytes) -> bytes:
    version = rng.choice((0x0000, 0x0200, 0x0300, 0x0304, 0x0305, 0xFFFF))
    return hello[:1] + struct.pack(">H", version) + hello[3:]


def _split(rng: random.Random, hello: bytes, plain_hello: bytes) -> bytes:
    """The handshake message over many records (legal, but a parser's reassembly path);
    sometimes with a zero-length record among them (illegal for handshakes)."""
    body = hello[RECORD_HEADER_BYTES:]
    head = hello[:3]
    out = []
    i = 0
    while i < len(body):
        n = rng.randrange(1, 64)
        out.append(head + struct.pack(">H", len(body[i : i + n])) + body[i : i + n])
        i += n
    if rng.random() < 0.3:
        out.insert(rng.randrange(len(out) + 1), head + b"\x00\x00")
    return b"".join(out)


def _oversized(rng: random.Random, hello: bytes, plain_hello: bytes) -> bytes:
    """A record over the largest TLS allows, then a little of its body."""
    length = rng.choice((MAX_RECORD_BYTES + 1, 0xFFFF))
    return hello[:3] + struct.pack(">H", length) + rng.randbytes(rng.randrange(1, 4096))


def _sslv2(rng: random.Random, hello: bytes, plain_hello: bytes) -> bytes:
    """An SSLv2-compatible ClientHello header, which modern OpenSSL refuses."""
    body = b"\x01\x00\x02" + rng.randbytes(rng.randrange(0, 64))
    return struct.pack(">H", 0x8000 | len(body)) + body


def _plain(rng: random.Random, hello: bytes, plain_hello: bytes) -> bytes:
    """A plain-text Waltz peer on the TLS port, its hello and some frame bytes."""
    return plain_hello + rng.randbytes(rng.randrange(0, 64))


def _duplicate(rng: random.Random, hello: bytes, plain_hello: bytes) -> bytes:
    return hello * rng.randrange(2, 4)


def _garbage(rng: random.Random, hello: bytes, plain_hello: bytes) -> bytes:
    return rng.randbytes(rng.choice((1, 5, 64, 1024, 20_000)))


Mutation = Callable[[random.Random, bytes, bytes], bytes]

TLS_MUTATIONS: dict[str, tuple[Mutation, int]] = {
    "bit-flip": (_bit_flip, 4),
    "truncate": (_truncate, 2),
    "field": (_field, 4),
    "content-type": (_content_type, 1),
    "record-version": (_record_version, 1),
    "split": (_split, 2),
    "oversized": (_oversized, 1),
    "sslv2": (_sslv2, 1),
    "plain": (_plain, 1),
    "duplicate": (_duplicate, 1),
    "garbage": (_garbage, 1),
}
_NAMES = tuple(TLS_MUTATIONS)
_WEIGHTS = tuple(weight for _, weight in TLS_MUTATIONS.values())


def mutate_client_hello(rng: random.Random, hello: bytes, plain_hello: bytes) -> tuple[str, bytes]:
    """A mutation's name and the bytes it makes of ``hello``; ``plain_hello`` is the
    protocol's plain-text hello (a peer that does not speak TLS)."""
    (name,) = rng.choices(_NAMES, _WEIGHTS)
    return name, TLS_MUTATIONS[name][0](rng, hello, plain_hello)
