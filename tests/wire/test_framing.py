"""Frames and the connection handshake."""

from __future__ import annotations

import contextlib
import struct

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from waltz_client.wire.errors import (
    FrameTooLarge,
    HandshakeError,
    MalformedFrame,
    ProtocolError,
)
from waltz_client.wire.framing import (
    DEFAULT_MAX_FRAME_BYTES,
    HANDSHAKE_BYTES,
    MAGIC,
    FrameDecoder,
    HandshakeStatus,
    Hello,
    HelloReply,
    Service,
    encode_frame,
    negotiate,
)

U16 = st.integers(0, 0xFFFF)
FRAMES = st.lists(st.tuples(st.integers(0, 255), st.binary(max_size=300)), max_size=12)


def split(stream: bytes, rnd, max_chunk: int) -> list[bytes]:
    chunks = []
    pos = 0
    while pos < len(stream):
        n = rnd.randint(1, max_chunk)
        chunks.append(stream[pos : pos + n])
        pos += n
    return chunks


def feed_all(decoder: FrameDecoder, chunks) -> list[tuple[int, bytes]]:
    frames = []
    for chunk in chunks:
        frames.extend(decoder.feed(chunk))
    return frames


# --- frames ----------------------------------------------------------------------------


def test_frame_layout():
    assert encode_frame(7, b"abc") == b"\x00\x00\x00\x04\x07abc"
    assert encode_frame(255, b"") == b"\x00\x00\x00\x01\xff"
    assert encode_frame(1, bytearray(b"x")) == b"\x00\x00\x00\x02\x01x"
    assert encode_frame(1, memoryview(b"x")) == b"\x00\x00\x00\x02\x01x"


def test_default_max_frame_is_64_mib():
    assert DEFAULT_MAX_FRAME_BYTES == 64 * 1024 * 1024
    assert FrameDecoder().max_frame_bytes == DEFAULT_MAX_FRAME_BYTES


@given(FRAMES, st.sampled_from([1, 2, 3, 5, 7, 64, 1000, 1 << 20]), st.randoms())
def test_frames_survive_any_chunking(frames, max_chunk, rnd):
    stream = b"".join(encode_frame(t, body) for t, body in frames)
    decoder = FrameDecoder()
    assert feed_all(decoder, split(stream, rnd, max_chunk)) == frames
    assert decoder.buffered == 0


@given(st.integers(0, 255), st.binary(max_size=200), st.data())
def test_a_partial_frame_is_kept_until_complete(message_type, body, data):
    frame = encode_frame(message_type, body)
    cut = data.draw(st.integers(0, len(frame) - 1), label="cut")
    decoder = FrameDecoder()
    assert decoder.feed(frame[:cut]) == []
    assert decoder.buffered == cut
    assert decoder.feed(frame[cut:] + frame[:cut]) == [(message_type, body)]
    assert decoder.buffered == cut  # the next frame's start is kept too
    assert decoder.feed(frame[cut:]) == [(message_type, body)]
    assert decoder.buffered == 0


def test_truncated_body_returns_nothing_yet():
    decoder = FrameDecoder()
    assert decoder.feed(b"\x00\x00\x00\x0a\x05abc") == []
    assert decoder.buffered == 8
    assert decoder.feed(b"defgh") == []
    assert decoder.buffered == 13
    assert decoder.feed(b"iXYZ") == [(5, b"abcdefghi")]
    assert decoder.buffered == 3


def test_feed_accepts_bytearray_and_memoryview():
    decoder = FrameDecoder()
    assert decoder.feed(bytearray(b"\x00\x00\x00\x02\x09")) == []
    assert decoder.feed(memoryview(b"z")) == [(9, b"z")]


def test_a_kept_partial_frame_is_a_copy_of_the_callers_buffer():
    # A read parsed in place keeps only its partial frame, copied: the caller may reuse
    # its buffer for the next read.
    decoder = FrameDecoder()
    read = bytearray(b"\x00\x00\x00\x02\x07a" + b"\x00\x00\x00\x03\x08b")
    assert decoder.feed(read) == [(7, b"a")]
    read[:] = b"\xff" * len(read)
    assert decoder.feed(b"c") == [(8, b"bc")]
    assert decoder.buffered == 0


def test_frame_length_zero_is_malformed():
    with pytest.raises(MalformedFrame, match=r"frame length 0: a frame holds at least its type"):
        FrameDecoder().feed(b"\x00\x00\x00\x00")


def test_frame_length_zero_after_a_good_frame_is_malformed():
    decoder = FrameDecoder()
    assert decoder.feed(encode_frame(1, b"ok")) == [(1, b"ok")]
    with pytest.raises(MalformedFrame, match=r"frame length 0"):
        decoder.feed(b"\x00\x00\x00\x00\x01")


def test_oversized_length_raises_as_soon_as_the_header_arrives():
    decoder = FrameDecoder(max_frame_bytes=1000)
    assert decoder.feed(b"\x00\x00\x03") == []
    with pytest.raises(FrameTooLarge, match=r"frame length 1001 exceeds the maximum of 1000 bytes"):
        decoder.feed(b"\xe9")  # 0x3e9 = 1001; no body byte has been sent
    assert decoder.buffered == 4  # nothing was waiting for the body


def test_oversized_default_limit():
    header = struct.pack(">I", DEFAULT_MAX_FRAME_BYTES + 1)
    with pytest.raises(FrameTooLarge, match=rf"{DEFAULT_MAX_FRAME_BYTES + 1} exceeds"):
        FrameDecoder().feed(header)
    with pytest.raises(FrameTooLarge, match=r"4294967295 exceeds the maximum of 67108864"):
        FrameDecoder().feed(b"\xff\xff\xff\xff")


def test_length_at_the_maximum_is_accepted():
    decoder = FrameDecoder(max_frame_bytes=5)
    assert decoder.feed(encode_frame(3, b"abcd")) == [(3, b"abcd")]
    with pytest.raises(FrameTooLarge, match=r"frame length 6 exceeds the maximum of 5"):
        decoder.feed(encode_frame(3, b"abcde"))


def test_a_bad_length_after_good_frames_still_raises():
    decoder = FrameDecoder(max_frame_bytes=100)
    with pytest.raises(FrameTooLarge):
        decoder.feed(encode_frame(1, b"a") + struct.pack(">I", 101))


@given(st.lists(st.binary(min_size=1, max_size=64), max_size=20))
def test_random_bytes_only_raise_protocol_errors(chunks):
    decoder = FrameDecoder(max_frame_bytes=256)
    try:
        for chunk in chunks:
            for message_type, body in decoder.feed(chunk):
                assert 0 <= message_type <= 255
                assert len(body) < 256
    except ProtocolError as e:
        assert isinstance(e, (MalformedFrame, FrameTooLarge))


# --- handshake ---------------------------------------------------------------------------


def test_hello_layout():
    assert HANDSHAKE_BYTES == 12
    assert MAGIC == b"WLTZ"
    assert Hello(Service.STORAGE, 1, 3).encode() == b"WLTZ" + bytes.fromhex("01 00 0001 0003 0000")
    assert Hello(Service.SERVER, 0, 0xFFFF).encode() == b"WLTZ" + bytes.fromhex(
        "02 00 0000 ffff 0000"
    )


def test_reply_layout():
    assert HelloReply(HandshakeStatus.OK, 1).encode() == b"WLTZ" + bytes.fromhex(
        "00 00 0001 0000 0000"
    )
    assert HelloReply(HandshakeStatus.WRONG_SERVICE, 0).encode() == b"WLTZ" + bytes.fromhex(
        "02 00 0000 0000 0000"
    )


def test_service_and_status_codes():
    assert {s.name: s.value for s in Service} == {"STORAGE": 1, "SERVER": 2}
    assert {s.name: s.value for s in HandshakeStatus} == {
        "OK": 0,
        "UNSUPPORTED_VERSION": 1,
        "WRONG_SERVICE": 2,
    }


@given(st.sampled_from(Service), U16, U16)
def test_hello_round_trip(service, a, b):
    hello = Hello(service, min(a, b), max(a, b))
    encoded = hello.encode()
    assert len(encoded) == HANDSHAKE_BYTES
    assert Hello.decode(encoded) == hello


@given(st.sampled_from(HandshakeStatus), U16)
def test_reply_round_trip(status, version):
    reply = HelloReply(status, version)
    encoded = reply.encode()
    assert len(encoded) == HANDSHAKE_BYTES
    assert HelloReply.decode(encoded) == reply


def test_reserved_bytes_are_ignored():
    hello = bytearray(Hello(Service.STORAGE, 1, 2).encode())
    hello[5] = 0xAA
    hello[10:12] = b"\xbb\xcc"
    assert Hello.decode(bytes(hello)) == Hello(Service.STORAGE, 1, 2)
    reply = bytearray(HelloReply(HandshakeStatus.OK, 1).encode())
    reply[5] = 0xAA
    reply[8:12] = b"\x01\x02\x03\x04"
    assert HelloReply.decode(bytes(reply)) == HelloReply(HandshakeStatus.OK, 1)


@pytest.mark.parametrize("n", [0, 4, 11, 13, 24])
def test_hello_of_wrong_length(n):
    data = (Hello(Service.STORAGE, 1, 1).encode() * 2)[:n]
    with pytest.raises(HandshakeError, match=rf"hello must be 12 bytes, got {n}"):
        Hello.decode(data)


@pytest.mark.parametrize("n", [0, 10, 11, 13])
def test_reply_of_wrong_length(n):
    data = (HelloReply(HandshakeStatus.OK, 1).encode() * 2)[:n]
    with pytest.raises(HandshakeError, match=rf"hello reply must be 12 bytes, got {n}"):
        HelloReply.decode(data)


@pytest.mark.parametrize("magic", [b"WLTY", b"wltz", b"\x00\x00\x00\x00", b"GET "])
def test_hello_with_bad_magic(magic):
    data = magic + Hello(Service.STORAGE, 1, 1).encode()[4:]
    with pytest.raises(HandshakeError, match=r"bad magic .*: not a Waltz client"):
        Hello.decode(data)


def test_http_request_is_not_a_hello():
    with pytest.raises(HandshakeError, match=r"bad magic b'GET ': not a Waltz client"):
        Hello.decode(b"GET / HTTP/1")


def test_reply_with_bad_magic():
    data = b"XLTZ" + HelloReply(HandshakeStatus.OK, 1).encode()[4:]
    with pytest.raises(HandshakeError, match=r"bad magic b'XLTZ' in hello reply"):
        HelloReply.decode(data)


@pytest.mark.parametrize("service", [0, 3, 255])
def test_hello_with_unknown_service(service):
    data = struct.pack(">4sBBHHH", b"WLTZ", service, 0, 1, 1, 0)
    with pytest.raises(HandshakeError, match=rf"unknown service {service} in hello"):
        Hello.decode(data)


@given(U16, U16)
@example(1, 2)
@example(0, 1)
@example(0xFFFE, 0xFFFF)
def test_hello_with_empty_version_range(a, b):
    low, high = max(a, b), min(a, b)
    data = struct.pack(">4sBBHHH", b"WLTZ", 1, 0, low, high, 0)
    if low == high:
        assert Hello.decode(data) == Hello(Service.STORAGE, low, high)
        return
    with pytest.raises(HandshakeError, match=rf"hello version range {low}\.\.{high} is empty"):
        Hello.decode(data)


@pytest.mark.parametrize("status", [3, 255])
def test_reply_with_unknown_status(status):
    data = struct.pack(">4sBBHH", b"WLTZ", status, 0, 1, 0) + b"\x00\x00"
    with pytest.raises(HandshakeError, match=rf"unknown handshake status {status}"):
        HelloReply.decode(data)


@given(st.binary(max_size=16))
def test_random_preambles_only_raise_handshake_errors(data):
    for decode in (Hello.decode, HelloReply.decode):
        with contextlib.suppress(HandshakeError):
            decode(data)


def test_handshake_error_is_a_protocol_error():
    assert issubclass(HandshakeError, ProtocolError)


# --- negotiate ---------------------------------------------------------------------------


def test_negotiate_picks_the_highest_common_version():
    assert negotiate(Hello(Service.STORAGE, 1, 5), Service.STORAGE, range(3, 8)) == HelloReply(
        HandshakeStatus.OK, 5
    )
    assert negotiate(Hello(Service.STORAGE, 4, 9), Service.STORAGE, range(1, 6)) == HelloReply(
        HandshakeStatus.OK, 5
    )
    assert negotiate(Hello(Service.STORAGE, 1, 1), Service.STORAGE, range(1, 2)) == HelloReply(
        HandshakeStatus.OK, 1
    )


def test_negotiate_wrong_service():
    assert negotiate(Hello(Service.SERVER, 1, 1), Service.STORAGE, range(1, 2)) == HelloReply(
        HandshakeStatus.WRONG_SERVICE, 0
    )


@pytest.mark.parametrize(("low", "high"), [(2, 4), (0, 0), (100, 200)])
def test_negotiate_unsupported_version(low, high):
    reply = negotiate(Hello(Service.STORAGE, low, high), Service.STORAGE, range(1, 2))
    assert reply == HelloReply(HandshakeStatus.UNSUPPORTED_VERSION, 0)


@given(
    st.sampled_from(Service),
    st.sampled_from(Service),
    U16,
    U16,
    st.integers(0, 40),
    st.integers(0, 40),
)
def test_negotiate_matches_a_brute_force_search(offered, accepted, a, b, start, width):
    a, b = a % 50, b % 50
    hello = Hello(offered, min(a, b), max(a, b))
    supported = range(start, start + width)
    reply = negotiate(hello, accepted, supported)
    common = [v for v in supported if hello.min_version <= v <= hello.max_version]
    if offered != accepted:
        assert reply == HelloReply(HandshakeStatus.WRONG_SERVICE, 0)
    elif not common:
        assert reply == HelloReply(HandshakeStatus.UNSUPPORTED_VERSION, 0)
    else:
        assert reply == HelloReply(HandshakeStatus.OK, max(common))
    assert HelloReply.decode(reply.encode()) == reply
