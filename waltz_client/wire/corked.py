"""Frames written during one turn of the event loop leave in one system call.

A server answers many partitions at once: when a storage group commits, every partition's
session wakes, and each sends its next batch, its responses and its feed entries. Written
one by one, each frame costs a ``send`` (profiled: the server's socket writes were about
45% of its event-loop time with 4 partitions). Corked, the frames of one turn go out
together with ``writelines`` when the loop gets to the flush it scheduled, after the
callbacks already due: no timer, no added wait.

Over TLS the small buffers are joined first: uvloop's TLS transport encrypts each buffer
that ``writelines`` gets as its own TLS record (and the peer decrypts each on its own),
so a frame written as a head and a body cost two records, a turn of ten frames twenty.
A buffer of a TLS record's size or more (a range read's records) is left as it is: its
records are full anyway, and copying megabytes would cost more than it saves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable


def is_tls(transport: asyncio.BaseTransport) -> bool:
    return transport.get_extra_info("ssl_object") is not None


TLS_RECORD_BYTES = 16 * 1024  # the most a TLS record holds


def coalesced(
    buffers: list[bytes | bytearray | memoryview],
) -> list[bytes | bytearray | memoryview]:
    """``buffers`` with each run of buffers smaller than a TLS record joined into one."""
    out: list[bytes | bytearray | memoryview] = []
    run: list[bytes | bytearray | memoryview] = []
    for buffer in buffers:
        if len(buffer) < TLS_RECORD_BYTES:
            run.append(buffer)
            continue
        if run:
            out.append(b"".join(run) if len(run) > 1 else run[0])
            run = []
        out.append(buffer)
    if run:
        out.append(b"".join(run) if len(run) > 1 else run[0])
    return out


def write_buffers(
    transport: asyncio.WriteTransport,
    buffers: list[bytes | bytearray | memoryview],
    tls: bool | None = None,
) -> None:
    """``transport.writelines(buffers)``; over TLS (``tls``, or asked of the transport)
    the small buffers joined (``coalesced``), so a turn's frames make one TLS record
    rather than one a buffer."""
    if len(buffers) > 1 and (is_tls(transport) if tls is None else tls):
        transport.writelines(coalesced(buffers))
    else:
        transport.writelines(buffers)


class CorkedWriter:
    """Writes to ``transport`` gathered until the loop runs the flush they scheduled."""

    __slots__ = ("_loop", "_parts", "_tls", "_transport")

    def __init__(self, transport: asyncio.WriteTransport) -> None:
        self._transport = transport
        self._tls = is_tls(transport)
        self._loop = asyncio.get_running_loop()
        self._parts: list[bytes | bytearray | memoryview] | None = None

    def write(self, frame: bytes | bytearray | memoryview) -> None:
        parts = self._parts
        if parts is None:
            self._parts = [frame]
            self._loop.call_soon(self.flush)
        else:
            parts.append(frame)

    def writelines(self, frames: Iterable[bytes | bytearray | memoryview]) -> None:
        parts = self._parts
        if parts is None:
            self._parts = list(frames)
            self._loop.call_soon(self.flush)
        else:
            parts.extend(frames)

    @property
    def pending(self) -> int:
        """Buffers written but not yet handed to the transport."""
        return len(self._parts) if self._parts else 0

    def flush(self) -> None:
        """Hand what was written to the transport now (before closing it, say)."""
        parts, self._parts = self._parts, None
        if parts and not self._transport.is_closing():
            write_buffers(self._transport, parts, self._tls)
