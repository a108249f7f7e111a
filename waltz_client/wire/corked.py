"""Frames written during one turn of the event loop leave in one system call.

A server answers many partitions at once: when a storage group commits, every partition's
session wakes, and each sends its next batch, its responses and its feed entries. Written
one by one, each frame costs a ``send`` (profiled: the server's socket writes were about
45% of its event-loop time with 4 partitions). Corked, the frames of one turn go out
together with ``writelines`` when the loop gets to the flush it scheduled, after the
callbacks already due: no timer, no added wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable


class CorkedWriter:
    """Writes to ``transport`` gathered until the loop runs the flush they scheduled."""

    __slots__ = ("_loop", "_parts", "_transport")

    def __init__(self, transport: asyncio.WriteTransport) -> None:
        self._transport = transport
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
            self._transport.writelines(parts)
