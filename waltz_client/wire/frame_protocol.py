"""Frames read straight from the socket into their buffers (``asyncio.BufferedProtocol``).

A StreamReader copies every read twice (into its buffer, then out of it), and splitting
frames out of what it returns copied a large frame a third time. Here small frames are
cut from one scratch buffer the socket reads into; a large frame (a range read's
megabytes) gets a buffer of its own size, and the socket reads the rest of its body
straight into it, so its bytes are copied once, by the kernel.

A connection dials and shakes hands with streams (``OpenConnection``), then hands its
transport to a ``FrameProtocol`` (``transport.set_protocol``): the peer sends nothing
unasked after its handshake reply, so the stream has nothing buffered left to pass on.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable

from .errors import FrameTooLarge, MalformedFrame, ProtocolError

_LENGTH = struct.Struct(">I")
SCRATCH_BYTES = 256 * 1024
LARGE_FRAME_BYTES = 64 * 1024  # a body this long is read into a buffer of its own


class FrameProtocol(asyncio.BufferedProtocol):
    """Calls ``on_frame(message_type, body)`` for each frame in order and
    ``on_closed(error)`` once when the connection ends (None: closed cleanly). A frame
    ``on_frame`` refuses (it raises ProtocolError) closes the connection with that
    error. ``drain`` waits while the transport's write buffer is full."""

    def __init__(
        self,
        transport: asyncio.Transport,
        on_frame: Callable[[int, bytes | bytearray], None],
        on_closed: Callable[[BaseException | None], None],
        max_frame_bytes: int,
    ) -> None:
        self.transport = transport
        self._on_frame = on_frame
        self._on_closed = on_closed
        self._max_frame_bytes = max_frame_bytes
        self._scratch = bytearray(SCRATCH_BYTES)
        self._start = 0  # the first byte not yet cut into a frame
        self._end = 0  # the end of what the socket put in the scratch buffer
        self._large: bytearray | None = None  # the body of a large frame being read
        self._large_type = 0
        self._large_have = 0
        self._error: BaseException | None = None
        self._closed = False
        self._writable = asyncio.Event()
        self._writable.set()
        self._lost = asyncio.Event()
        transport.set_protocol(self)

    # --- reading ------------------------------------------------------------------------

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._large is not None:
            return memoryview(self._large)[self._large_have :]
        if self._start == self._end:
            self._start = self._end = 0
        elif len(self._scratch) - self._end < LARGE_FRAME_BYTES + 8:
            # Keep the partial frame, at the front: it fits (it is not a large one).
            pending = self._end - self._start
            self._scratch[:pending] = self._scratch[self._start : self._end]
            self._start, self._end = 0, pending
        return memoryview(self._scratch)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._closed:
            return
        try:
            if self._large is not None:
                self._large_have += nbytes
                if self._large_have == len(self._large):
                    body, self._large = self._large, None
                    self._on_frame(self._large_type, body)
                return
            self._end += nbytes
            self._cut_frames()
        except ProtocolError as e:
            self._fail(e)

    def data_received(self, data: bytes) -> None:
        """For transports that only deliver bytes (a simulated network): the same, through
        the buffers above."""
        view = memoryview(data)
        while view and not self._closed:
            buf = self.get_buffer(len(view))
            n = min(len(buf), len(view))
            buf[:n] = view[:n]
            view = view[n:]
            self.buffer_updated(n)

    def _cut_frames(self) -> None:
        scratch, start, end = self._scratch, self._start, self._end
        while end - start >= 4:
            (length,) = _LENGTH.unpack_from(scratch, start)
            if length == 0:
                raise MalformedFrame("frame length 0: a frame holds at least its type byte")
            if length > self._max_frame_bytes:
                raise FrameTooLarge(
                    f"frame length {length} exceeds the maximum of {self._max_frame_bytes} bytes"
                )
            if end - start - 4 >= length:
                body = bytes(scratch[start + 5 : start + 4 + length])
                message_type = scratch[start + 4]
                start += 4 + length
                self._start = start
                self._on_frame(message_type, body)
                if self._closed or self._large is not None:
                    return
                continue
            if length - 1 >= LARGE_FRAME_BYTES and end - start >= 5:
                # Its own buffer: what came so far, then the socket reads into it.
                have = end - start - 5
                self._large = bytearray(length - 1)
                self._large[:have] = scratch[start + 5 : end]
                self._large_type = scratch[start + 4]
                self._large_have = have
                self._start = self._end = 0
                return
            break
        self._start = start

    @property
    def buffered(self) -> int:
        """Bytes of a frame begun but not complete."""
        if self._large is not None:
            return 5 + self._large_have
        return self._end - self._start

    # --- the connection's end -----------------------------------------------------------

    def _fail(self, error: BaseException) -> None:
        self._error = error
        self.transport.close()
        self._finish(error)

    def _finish(self, error: BaseException | None) -> None:
        if not self._closed:
            self._closed = True
            self._writable.set()
            self._on_closed(error)

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is None and self.buffered:
            exc = MalformedFrame(f"the stream ended inside a frame, {self.buffered} bytes in")
        self._finish(self._error or exc)
        self._lost.set()

    async def wait_closed(self) -> None:
        await self._lost.wait()

    # --- writing ------------------------------------------------------------------------

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    async def drain(self) -> None:
        """Wait while the peer reads slower than we write (the write buffer is full)."""
        await self._writable.wait()
