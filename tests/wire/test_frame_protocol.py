"""FrameProtocol: frames cut from the socket's reads in order, whatever the read sizes;
a large body read into its own buffer; pause between frames; bad lengths end the
connection with the reason."""

from __future__ import annotations

import asyncio
import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from waltz_client.wire.errors import FrameTooLarge, MalformedFrame
from waltz_client.wire.frame_protocol import LARGE_FRAME_BYTES, FrameProtocol
from waltz_client.wire.framing import encode_frame


class Socket(asyncio.Transport):
    """What the protocol sees of a transport: reads paused or not, closed or not."""

    def __init__(self) -> None:
        super().__init__()
        self.protocol = None
        self.reading = True
        self.closed = False

    def set_protocol(self, protocol) -> None:
        self.protocol = protocol

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def close(self) -> None:
        self.closed = True

    def deliver(self, data: bytes, rnd: random.Random, max_read: int) -> None:
        """The socket's reads: into the protocol's buffers, at most ``max_read`` at once."""
        view = memoryview(data)
        while view:
            assert self.reading, "read while paused"
            buf = self.protocol.get_buffer(-1)
            assert len(buf) > 0
            n = min(len(buf), len(view), rnd.randint(1, max_read))
            buf[:n] = view[:n]
            view = view[n:]
            self.protocol.buffer_updated(n)


def _protocol(max_frame_bytes: int = 1 << 24):
    frames: list[tuple[int, bytes]] = []
    closed: list[BaseException | None] = []
    socket = Socket()
    protocol = FrameProtocol(
        socket, lambda t, b: frames.append((t, bytes(b))), closed.append, max_frame_bytes
    )
    return socket, protocol, frames, closed


BODIES = st.lists(
    st.one_of(
        st.binary(max_size=300),
        st.integers(LARGE_FRAME_BYTES - 2, LARGE_FRAME_BYTES + 3).map(os.urandom),
        st.integers(1, 400_000).map(os.urandom),
    ),
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(BODIES, st.randoms(), st.sampled_from([1, 7, 4096, 65536, 1 << 20]))
def test_frames_arrive_whole_and_in_order_whatever_the_reads(bodies, rnd, max_read):
    socket, protocol, frames, closed = _protocol()
    stream = b"".join(encode_frame(i % 250 + 1, body) for i, body in enumerate(bodies))
    socket.deliver(stream, rnd, max_read)
    assert frames == [(i % 250 + 1, body) for i, body in enumerate(bodies)]
    assert protocol.buffered == 0 and not closed


def test_a_large_body_is_read_into_its_own_buffer():
    socket, protocol, frames, _ = _protocol()
    body = os.urandom(3 * LARGE_FRAME_BYTES)
    frame = encode_frame(9, body)
    socket.deliver(frame[:1000], random.Random(1), 1000)
    rest = protocol.get_buffer(-1)
    assert len(rest) == len(body) - (1000 - 5)  # exactly the rest of the body
    socket.deliver(frame[1000:], random.Random(1), 1 << 20)
    assert frames == [(9, body)]


def test_pause_holds_the_next_frames_until_resumed_on_a_later_turn():
    async def scenario() -> None:
        socket, protocol, frames, _ = _protocol()
        pause_after = {2}

        def on_frame(t: int, body: bytes) -> None:
            frames.append((t, bytes(body)))
            if len(frames) in pause_after:
                protocol.pause()

        protocol._on_frame = on_frame
        stream = b"".join(encode_frame(1, b"%d" % i) for i in range(5))
        big = os.urandom(2 * LARGE_FRAME_BYTES)
        socket.deliver(stream + encode_frame(2, big)[:100], random.Random(2), 1 << 20)
        assert [b for _, b in frames] == [b"0", b"1"] and not socket.reading
        protocol.resume()
        assert len(frames) == 2  # not from inside resume()
        await asyncio.sleep(0)
        assert [b for _, b in frames] == [b"0", b"1", b"2", b"3", b"4"] and socket.reading
        socket.deliver(encode_frame(2, big)[100:], random.Random(3), 1 << 20)
        assert frames[-1] == (2, big)

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("head", "error", "reason"),
    [
        (b"\x00\x00\x00\x00", MalformedFrame, "frame length 0"),
        (b"\x00\x10\x00\x01", FrameTooLarge, "exceeds the maximum of 4096"),
    ],
)
def test_a_bad_length_ends_the_connection_with_the_reason(head, error, reason):
    socket, protocol, frames, closed = _protocol(max_frame_bytes=4096)
    socket.deliver(encode_frame(1, b"ok") + head + b"\x01", random.Random(4), 1 << 20)
    assert frames == [(1, b"ok")]
    assert socket.closed and isinstance(closed[0], error) and reason in str(closed[0])
    protocol.connection_lost(None)
    assert len(closed) == 1  # told once


def test_a_stream_that_ends_inside_a_frame_says_so():
    socket, protocol, _, closed = _protocol()
    socket.deliver(encode_frame(1, b"x" * 100)[:50], random.Random(5), 1 << 20)
    protocol.connection_lost(None)
    assert isinstance(closed[0], MalformedFrame) and "inside a frame, 50 bytes in" in str(closed[0])


def test_frames_held_while_paused_never_leave_the_socket_without_a_buffer():
    """A transport that still delivers while paused (a simulated network's inbox, data
    already decrypted): whole frames pile up and the scratch buffer grows for them."""

    async def scenario() -> None:
        socket, protocol, frames, closed = _protocol()
        protocol.pause()
        socket.reading = True  # this transport goes on delivering
        small = [os.urandom(1000) for _ in range(600)]  # 600 KB: more than the scratch
        protocol.data_received(b"".join(encode_frame(1, b) for b in small))
        assert frames == [] and not closed
        protocol.resume()
        await asyncio.sleep(0)
        assert [b for _, b in frames] == small

    asyncio.run(scenario())
