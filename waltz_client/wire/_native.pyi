# The compiled module's signatures (_native.c), for the type checker.
from collections.abc import Iterable

from _typeshed import ReadableBuffer

CLMUL: int

def crc32(data: ReadableBuffer, value: int = 0, /) -> int: ...
def crc32_tables(data: ReadableBuffer, value: int = 0, /) -> int: ...
def scan_wire(
    buf: ReadableBuffer, count: int, max_data_bytes: int, head: int = 32, /
) -> list[tuple[int, int, int]] | None: ...
def wire_to_disk(
    buf: ReadableBuffer,
    spans: list[tuple[int, int, int]],
    start: int,
    stop: int,
    out: bytearray,
    head: int = 32,
    /,
) -> list[int]: ...
def disk_to_wire(
    buf: ReadableBuffer, first_txid: int, ends: Iterable[int], head: int = 32, /
) -> tuple[bytes, list[tuple[int, int, int]]] | None: ...
def first_gap(spans: list[tuple[int, int, int]], expected: int, /) -> int: ...
def scan_disk(
    buf: ReadableBuffer, start: int, expected_txid: int, base: int, head: int = 32, /
) -> tuple[int, int, bytes]: ...
