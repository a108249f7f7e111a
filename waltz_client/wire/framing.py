"""Length-prefixed frames and the connection handshake.

Frame: ``u32 length`` (big-endian, counts the bytes after itself), ``u8
message type``, then the message body. A frame of length 0 is malformed; a
length over the configured maximum is refused before its body is read.

Handshake: before any frame, the connecting side sends a 12-byte hello
(magic ``WLTZ``, service, lowest and highest protocol version it speaks)
and the accepting side answers with a 12-byte reply (magic, status, the
version chosen). Anything but status OK is followed by a close.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import IntEnum

from .errors import FrameTooLarge, HandshakeError, MalformedFrame

FRAME_HEADER = struct.Struct(">IB")  # length, message type
DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024

# How a client reaches host:port: asyncio.open_connection, or a simulated network's.
OpenConnection = Callable[[str, int], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]

MAGIC = b"WLTZ"
_HELLO = struct.Struct(">4sBBHHH")  # magic, service, reserved, min, max, reserved
_REPLY = struct.Struct(">4sBBHH")  # magic, status, reserved, version, reserved
_REPLY_PAD = b"\x00\x00"
HANDSHAKE_BYTES = 12
assert _HELLO.size == HANDSHAKE_BYTES and _REPLY.size + len(_REPLY_PAD) == HANDSHAKE_BYTES


class Service(IntEnum):
    """Which protocol a connection speaks; a client dialling the wrong port learns it at once."""

    STORAGE = 1
    SERVER = 2


class HandshakeStatus(IntEnum):
    OK = 0
    UNSUPPORTED_VERSION = 1
    WRONG_SERVICE = 2


def encode_frame(message_type: int, body: bytes | bytearray | memoryview) -> bytes:
    return FRAME_HEADER.pack(len(body) + 1, message_type) + body


def frame_parts(
    message_type: int, head: bytes, payload: bytes | memoryview
) -> list[bytes | memoryview]:
    """A frame whose body is ``head`` then ``payload``, as buffers to write in turn: a
    large payload (records read from disk) goes to the socket without being copied."""
    return [FRAME_HEADER.pack(len(head) + len(payload) + 1, message_type) + head, payload]


_LENGTH = struct.Struct(">I")


class FrameDecoder:
    """Incremental frame splitter for a byte stream.

    ``feed`` bytes as they arrive; it returns the complete frames as
    ``(message_type, body)`` pairs and keeps any partial frame for the next
    call. A bad length raises at once, before the body is buffered.
    """

    __slots__ = ("_need", "_parts", "_pending", "max_frame_bytes")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        # A partial frame is kept as the chunks it came in (bytes), and joined once when
        # whole: a frame of megabytes (a range read) arrives in many reads, and
        # appending each to a buffer, then copying the body out of it, cost two copies.
        self._parts: list[bytes] = []
        self._pending = 0  # bytes in _parts
        self._need = 0  # bytes of the partial frame in all, header included; 0: not known
        self.max_frame_bytes = max_frame_bytes

    @property
    def buffered(self) -> int:
        return self._pending

    def _checked_length(self, length: int) -> int:
        if length == 0:
            raise MalformedFrame("frame length 0: a frame holds at least its type byte")
        if length > self.max_frame_bytes:
            raise FrameTooLarge(
                f"frame length {length} exceeds the maximum of {self.max_frame_bytes} bytes"
            )
        return length

    def feed(self, data: bytes | bytearray | memoryview) -> list[tuple[int, bytes]]:
        if not self._parts:
            return self._split(data)
        self._parts.append(bytes(data))  # a copy only if the caller may reuse its buffer
        self._pending += len(data)
        if not self._need and self._pending >= 4:
            (length,) = _LENGTH.unpack(b"".join(self._parts)[:4])
            self._need = 4 + self._checked_length(length)
        if not self._need or self._pending < self._need:
            return []
        parts, extra = self._parts, self._pending - self._need
        self._parts, self._pending, self._need = [], 0, 0
        last = parts[-1]
        cut = len(last) - extra
        if len(parts[0]) > 5:
            # The body in one copy: the first chunk after the frame head, up to the cut.
            message_type = parts[0][4]
            pieces = [memoryview(p) for p in parts]
            pieces[0] = pieces[0][5:]
            pieces[-1] = pieces[-1][:cut]
            body = b"".join(pieces)
        else:
            whole = b"".join([*parts[:-1], last[:cut]])
            message_type, body = whole[4], whole[5:]
        return [(message_type, body), *self._split(memoryview(last)[cut:])]

    def _split(self, data: bytes | bytearray | memoryview) -> list[tuple[int, bytes]]:
        """The whole frames in ``data`` (nothing pending), keeping a partial one."""
        frames: list[tuple[int, bytes]] = []
        pos = 0
        with memoryview(data) as view:
            end = len(view)
            while end - pos >= 4:
                (length,) = _LENGTH.unpack_from(view, pos)
                self._checked_length(length)
                if end - pos - 4 < length:
                    self._need = 4 + length
                    break
                frames.append((view[pos + 4], bytes(view[pos + 5 : pos + 4 + length])))
                pos += 4 + length
            if pos < end:  # the start of a frame still to come
                self._parts.append(bytes(view[pos:]))
                self._pending = end - pos
        return frames


@dataclass(frozen=True, slots=True)
class Hello:
    service: Service
    min_version: int
    max_version: int

    def encode(self) -> bytes:
        return _HELLO.pack(MAGIC, self.service, 0, self.min_version, self.max_version, 0)

    @classmethod
    def decode(cls, data: bytes) -> Hello:
        if len(data) != HANDSHAKE_BYTES:
            raise HandshakeError(f"hello must be {HANDSHAKE_BYTES} bytes, got {len(data)}")
        magic, service, _, low, high, _ = _HELLO.unpack(data)
        if magic != MAGIC:
            raise HandshakeError(f"bad magic {magic!r}: not a Waltz client (expected {MAGIC!r})")
        try:
            svc = Service(service)
        except ValueError:
            raise HandshakeError(f"unknown service {service} in hello") from None
        if low > high:
            raise HandshakeError(f"hello version range {low}..{high} is empty")
        return cls(svc, low, high)


@dataclass(frozen=True, slots=True)
class HelloReply:
    status: HandshakeStatus
    version: int

    def encode(self) -> bytes:
        return _REPLY.pack(MAGIC, self.status, 0, self.version, 0) + _REPLY_PAD

    @classmethod
    def decode(cls, data: bytes) -> HelloReply:
        if len(data) != HANDSHAKE_BYTES:
            raise HandshakeError(f"hello reply must be {HANDSHAKE_BYTES} bytes, got {len(data)}")
        magic, status, _, version, _ = _REPLY.unpack_from(data)
        if magic != MAGIC:
            raise HandshakeError(f"bad magic {magic!r} in hello reply: not a Waltz endpoint")
        try:
            st = HandshakeStatus(status)
        except ValueError:
            raise HandshakeError(f"unknown handshake status {status}") from None
        return cls(st, version)


def negotiate(hello: Hello, service: Service, supported: range) -> HelloReply:
    """The accepting side's decision: the highest version both sides speak."""
    if hello.service != service:
        return HelloReply(HandshakeStatus.WRONG_SERVICE, 0)
    best = min(hello.max_version, supported.stop - 1)
    if best < hello.min_version or best < supported.start:
        return HelloReply(HandshakeStatus.UNSUPPORTED_VERSION, 0)
    return HelloReply(HandshakeStatus.OK, best)
