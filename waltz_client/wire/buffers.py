"""Bounds-checked reading of big-endian fields from a frame body.

A decoder never trusts a length: every read checks the bytes left in the
frame, and every variable-length field is also checked against a caller's
bound before anything is allocated.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any

from .errors import MalformedMessage

_I8 = struct.Struct(">b")
_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")


class Reader:
    """A cursor over one frame body. Raises MalformedMessage on any overrun."""

    __slots__ = ("_buf", "_end", "pos")

    def __init__(self, buf: bytes | bytearray | memoryview, pos: int = 0) -> None:
        self._buf = buf
        self._end = len(buf)
        self.pos = pos

    @property
    def remaining(self) -> int:
        return self._end - self.pos

    def _take(self, n: int, what: str) -> int:
        start = self.pos
        if n > self._end - start:
            raise MalformedMessage(
                f"{what}: needs {n} bytes at offset {start}, only {self._end - start} left"
            )
        self.pos = start + n
        return start

    def _unpack(self, st: struct.Struct, what: str) -> int:
        start = self._take(st.size, what)
        value: int = st.unpack_from(self._buf, start)[0]
        return value

    def peek(self, st: struct.Struct) -> tuple[Any, ...] | None:
        """All of ``st``'s fields at the cursor in one unpack, without moving it; None if
        fewer bytes are left. A fast path for a fixed run of fields: the caller moves on
        with ``skip``, or reads field by field, whose errors name the field."""
        if self._end - self.pos < st.size:
            return None
        return st.unpack_from(self._buf, self.pos)

    def skip(self, n: int) -> None:
        """Move past ``n`` bytes that ``peek`` showed are there."""
        self.pos += n

    def u8(self, what: str) -> int:
        return self._unpack(_U8, what)

    def bool(self, what: str) -> bool:
        value = self._unpack(_U8, what)
        if value > 1:
            raise MalformedMessage(f"{what}: boolean must be 0 or 1, got {value}")
        return value == 1

    def u16(self, what: str) -> int:
        return self._unpack(_U16, what)

    def i32(self, what: str) -> int:
        return self._unpack(_I32, what)

    def u32(self, what: str) -> int:
        return self._unpack(_U32, what)

    def i64(self, what: str) -> int:
        return self._unpack(_I64, what)

    def count(self, what: str, maximum: int) -> int:
        """A non-negative element count (i32), bounded by ``maximum``."""
        n = self.i32(what)
        if n < 0 or n > maximum:
            raise MalformedMessage(f"{what}: count {n} is outside 0..{maximum}")
        return n

    def raw(self, n: int, what: str) -> bytes:
        start = self._take(n, what)
        return bytes(self._buf[start : start + n])

    def uuid(self, what: str) -> uuid.UUID:
        return uuid.UUID(bytes=self.raw(16, what))

    def string(self, what: str, maximum: int) -> str:
        n = self.u16(what)
        if n > maximum:
            raise MalformedMessage(f"{what}: string length {n} exceeds {maximum}")
        data = self.raw(n, what)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise MalformedMessage(f"{what}: not valid UTF-8 ({e.reason})") from None

    def rest(self) -> memoryview:
        """Everything left, as a view; the cursor moves to the end."""
        start = self.pos
        self.pos = self._end
        return memoryview(self._buf)[start:]

    def expect_end(self, what: str) -> None:
        if self.pos != self._end:
            raise MalformedMessage(f"{what}: {self._end - self.pos} unexpected trailing bytes")


def pack_string(text: str, maximum: int = 65535) -> bytes:
    """A u16-length-prefixed UTF-8 string, cut (on a character boundary) to fit."""
    data = text.encode("utf-8", "backslashreplace")  # never fail on a lone surrogate
    if len(data) > maximum:
        data = data[:maximum].decode("utf-8", "ignore").encode("utf-8")
    return _U16.pack(len(data)) + data
