"""The compiled per-record loops (``_native.c``), or ``None`` where they are not built.

``pip install`` compiles them where it finds a C compiler (setup.py; the extension is
optional). Each caller keeps its pure-Python loop: it runs where the module is missing,
and, after the compiled one found a record wrong, again to say precisely what.
``WALTZ_PURE_PYTHON=1`` turns the compiled loops off (to compare, or to rule them out).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer


class NativeLoops(Protocol):
    """The compiled module's functions (their signatures: ``_native.pyi``)."""

    CLMUL: int

    def crc32(self, data: ReadableBuffer, value: int = 0, /) -> int: ...
    def crc32_tables(self, data: ReadableBuffer, value: int = 0, /) -> int: ...
    def scan_wire(
        self, buf: ReadableBuffer, count: int, max_data_bytes: int, head: int = 32, /
    ) -> list[tuple[int, int, int]] | None: ...
    def wire_to_disk(
        self,
        buf: ReadableBuffer,
        spans: list[tuple[int, int, int]],
        start: int,
        stop: int,
        out: bytearray,
        head: int = 32,
        /,
    ) -> list[int]: ...
    def disk_to_wire(
        self, buf: ReadableBuffer, first_txid: int, ends: Iterable[int], head: int = 32, /
    ) -> tuple[bytes, list[tuple[int, int, int]]] | None: ...
    def first_gap(self, spans: list[tuple[int, int, int]], expected: int, /) -> int: ...
    def scan_disk(
        self, buf: ReadableBuffer, start: int, expected_txid: int, base: int, head: int = 32, /
    ) -> tuple[int, int, bytes]: ...


def _pure_python_asked() -> bool:
    return os.environ.get("WALTZ_PURE_PYTHON", "").lower() in ("1", "true", "yes")


def _load() -> NativeLoops | None:
    if _pure_python_asked():
        return None
    try:
        from . import _native
    except ImportError:
        return None
    return _native


native = _load()


def describe() -> str:
    """Which loops this process runs, for logs and benchmark headers."""
    if native is not None:
        return "compiled" + (", CRC-32 by CLMUL" if native.CLMUL else ", CRC-32 by tables")
    if _pure_python_asked():
        return "Python (WALTZ_PURE_PYTHON)"
    return "Python (the compiled ones are not built)"


__all__ = ["describe", "native"]
