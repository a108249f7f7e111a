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
import contextlib
import logging
import struct
from collections import deque
from collections.abc import Callable

from .errors import FrameTooLarge, MalformedFrame, ProtocolError

log = logging.getLogger(__name__)

_LENGTH = struct.Struct(">I")
SCRATCH_BYTES = 256 * 1024
LARGE_FRAME_BYTES = 64 * 1024  # a body this long is read into a buffer of its own


# How long closing a connection waits for a clean shutdown (TLS's close_notify) before it
# drops the transport.
CLOSE_GRACE = 1.0


class FrameProtocol(asyncio.BufferedProtocol):
    """Calls ``on_frame(message_type, body)`` for each frame in order and
    ``on_closed(error)`` once when the connection ends (None: closed cleanly). A frame
    ``on_frame`` refuses (it raises ProtocolError) closes the connection with that
    error. ``pause`` stops both the frames (between two of them) and the socket reads
    until ``resume``; ``drain`` waits while the transport's write buffer is full."""

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
        self._held: deque[tuple[int, bytes | bytearray]] = deque()  # whole, while paused
        self._paused = False
        self._resuming = False  # _deliver_held is scheduled
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
            if len(self._scratch) - pending < LARGE_FRAME_BYTES + 8:  # whole frames held
                self._scratch.extend(bytes(len(self._scratch)))
        return memoryview(self._scratch)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._closed:
            return
        try:
            if self._large is not None:
                self._large_have += nbytes
                if self._large_have == len(self._large):
                    body, self._large = self._large, None
                    if self._paused or self._held:  # in order, after those held
                        self._held.append((self._large_type, body))
                    else:
                        self._on_frame(self._large_type, body)
                return
            self._end += nbytes
            self._cut_frames()
        except ProtocolError as e:
            self._fail(e)
        except Exception as e:  # the consumer's own fault: end the connection, say why
            log.exception("frame consumer failed")
            self._fail(e)

    def pause(self) -> None:
        """No more frames (after the one being handled) until ``resume``; the socket is
        not read meanwhile, so the peer's writes back up."""
        if not self._paused:
            self._paused = True
            with contextlib.suppress(RuntimeError):  # closing
                self.transport.pause_reading()

    def resume(self) -> None:
        """Frames again, from the next turn of the loop: never from inside the caller,
        which may still be settling its own state (and may pause again)."""
        if not self._paused or self._closed:
            return
        self._paused = False
        if not self._resuming:
            self._resuming = True
            asyncio.get_running_loop().call_soon(self._deliver_held)

    def _deliver_held(self) -> None:
        self._resuming = False
        try:
            while self._held and not self._paused and not self._closed:
                self._on_frame(*self._held.popleft())
            self._cut_frames()
        except ProtocolError as e:
            self._fail(e)
            return
        except Exception as e:
            log.exception("frame consumer failed")
            self._fail(e)
            return
        if not self._paused and not self._closed:
            with contextlib.suppress(RuntimeError):  # closing
                self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        """For transports that only deliver bytes (a simulated network): the same, through
        the buffers above."""
        view = memoryview(data)
        while view and not self._closed:
            buf = self.get_buffer(len(view))
            n = min(len(buf), len(view))
            buf[:n] = view[:n]
            del buf  # no export left: the next get_buffer may grow the scratch buffer
            view = view[n:]
            self.buffer_updated(n)

    def _cut_frames(self) -> None:
        # self._start moves before each frame is handed on: its consumer may pause, or
        # resume (which cuts the next frames itself), before this loop looks again.
        scratch = self._scratch
        while not (self._paused or self._closed or self._held) and self._large is None:
            start, end = self._start, self._end
            if end - start < 4:
                return
            (length,) = _LENGTH.unpack_from(scratch, start)
            if length == 0:
                raise MalformedFrame("frame length 0: a frame holds at least its type byte")
            if length > self._max_frame_bytes:
                raise FrameTooLarge(
                    f"frame length {length} exceeds the maximum of {self._max_frame_bytes} bytes"
                )
            if end - start - 4 >= length:
                body = bytes(scratch[start + 5 : start + 4 + length])
                self._start = start + 4 + length
                self._on_frame(scratch[start + 4], body)
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

    async def wait_closed_or_abort(self, grace: float = CLOSE_GRACE) -> None:
        """After ``close()``: wait until the connection is gone, at most ``grace`` seconds
        for a clean shutdown, then drop it. A peer that stopped answering (paused, cut
        off) never answers TLS's close either, and asyncio would wait 30 s for it: a
        partition's recovery waited that long behind a paused storage node. Shielded:
        a cancelled caller does not cancel the wait other callers share."""
        try:
            async with asyncio.timeout(grace):
                await asyncio.shield(self._lost.wait())
        except TimeoutError:
            self.transport.abort()
            await asyncio.shield(self._lost.wait())

    # --- writing ------------------------------------------------------------------------

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    async def drain(self) -> None:
        """Wait while the peer reads slower than we write (the write buffer is full)."""
        await self._writable.wait()
