"""The guarded, framed peer connection both daemons build on
(``waltz_client.runtime.peer_connection``), without sockets: a toy daemon's connection on a
recording transport.

Checked here: a slot from the guard or a refusal; the hello answered and a bad one
refused; frames taken in order, and held (the socket paused) while the daemon says stop;
a malformed or truncated frame told, counted and closed, and nothing taken after; a
certificate identity refused; a broken deadline aborts; the guard forgets a connection
lost, with its partial frame.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from waltz_client.runtime.peer_connection import ErrorKinds, PeerConnection
from waltz_client.runtime.peer_limits import PeerGuard, PeerLimits
from waltz_client.runtime.peer_warnings import PeerWarnings
from waltz_client.wire.errors import ProtocolError
from waltz_client.wire.framing import (
    HANDSHAKE_BYTES,
    HandshakeStatus,
    Hello,
    HelloReply,
    Service,
    encode_frame,
)

log = logging.getLogger("test_peer_connection")
BAD_TYPE = 99


class RecordingTransport:
    def __init__(self, address: str = "10.0.0.1") -> None:
        self.address = address
        self.written: list[bytes] = []
        self.paused = False
        self.closing = False
        self.aborted = False
        self.high_water: int | None = None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return (self.address, 5) if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.high_water = high

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = self.aborted = True


class ToyConnection(PeerConnection):
    """Takes every frame but type 99 (malformed); holds the frames received while ``hold``
    is set, and stops reading while over the guard's budget."""

    peer_warnings = PeerWarnings(log)
    log_name = "toy connection"
    service = Service.STORAGE
    protocol_versions = range(1, 3)
    errors = ErrorKinds("refused", "late", "bad_handshake", "malformed", "unauthorized")

    def __init__(self, guard: PeerGuard, refuse_identity: str | None = None) -> None:
        self.errors_counted: list[str] = []
        super().__init__(guard, self.errors_counted.append, 1234, 64 * 1024)
        self.taken: list[tuple[int, bytes]] = []
        self.told: list[str] = []
        self.hold = False
        self.budget_stopped = False
        self._refuse_identity = refuse_identity

    def _take(self, message_type: int, body: bytes) -> None:
        if message_type == BAD_TYPE:
            raise ProtocolError(f"unknown message type {message_type}")
        self.taken.append((message_type, body))
        if not self._ready:
            self._become_ready()

    def _holds_reading(self) -> bool:
        return self.budget_stopped

    def _holds_frames(self) -> bool:
        return self.hold

    def over_budget(self, over: bool) -> None:
        self.budget_stopped = over
        self._update_reading()

    def _identity_refusal(self) -> str | None:
        return self._refuse_identity

    def _tell_malformed(self, reason: str) -> None:
        self.told.append(reason)

    def release(self) -> None:
        self.hold = False
        self._work_through_backlog()


def guard(**limits: Any) -> PeerGuard:
    return PeerGuard(PeerLimits(**limits), "first frame")


def connected(
    peer_guard: PeerGuard | None = None, address: str = "10.0.0.1"
) -> tuple[ToyConnection, RecordingTransport]:
    conn = ToyConnection(peer_guard or guard())
    transport = RecordingTransport(address)
    conn.connection_made(transport)  # type: ignore[arg-type]
    conn.data_received(Hello(Service.STORAGE, 1, 2).encode())
    assert HelloReply.decode(transport.written.pop(0)).status == HandshakeStatus.OK
    return conn, transport


def frame(message_type: int, body: bytes = b"body") -> bytes:
    return encode_frame(message_type, body)


def test_a_connection_takes_a_slot_and_the_write_limit_of_its_daemon() -> None:
    peer_guard = guard()
    conn, transport = connected(peer_guard)
    assert set(peer_guard.connections) == {conn}
    assert (conn.peer, conn.address) == ("10.0.0.1:5", "10.0.0.1")
    assert transport.high_water == 1234
    assert not conn.ready and not conn.closed


def test_frames_are_taken_in_order_and_wait_unread_while_the_daemon_holds_them() -> None:
    conn, transport = connected()
    conn.data_received(frame(1, b"a") + frame(2, b"b") + frame(3, b"c")[:4])
    assert conn.taken == [(1, b"a"), (2, b"b")] and conn.ready
    assert conn.partial == 4 and conn.partial_since is not None
    conn.hold = True
    conn.data_received(frame(3, b"c")[4:] + frame(4, b"d"))
    assert conn.taken == [(1, b"a"), (2, b"b")]
    assert transport.paused and conn.reading_paused and conn.partial == 0
    conn.release()
    assert conn.taken == [(1, b"a"), (2, b"b"), (3, b"c"), (4, b"d")]
    assert not transport.paused and not conn.reading_paused


def test_the_budget_stops_reading_without_holding_the_frames_received(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    conn, transport = connected()
    conn.over_budget(True)
    assert transport.paused
    conn.data_received(frame(1))
    assert conn.taken == [(1, b"body")] and transport.paused
    monkeypatch.setattr(time, "monotonic", lambda: 100.0)
    conn.data_received(frame(2)[:3])
    assert conn.partial_since == 100.0
    # A frame's deadline counts only while the socket is read: from the resume on.
    monkeypatch.setattr(time, "monotonic", lambda: 200.0)
    conn.over_budget(False)
    assert not transport.paused and conn.partial_since == 200.0


@pytest.mark.parametrize(
    "hello, words",
    [
        (Hello(Service.SERVER, 1, 2).encode(), "handshake WRONG_SERVICE (SERVER 1..2)"),
        (Hello(Service.STORAGE, 7, 9).encode(), "handshake UNSUPPORTED_VERSION (STORAGE 7..9)"),
        (b"GET / HTTP/1.1\r\n\r\n", "handshake: "),
    ],
)
def test_a_bad_hello_is_counted_logged_and_closed(
    caplog: pytest.LogCaptureFixture, hello: bytes, words: str
) -> None:
    conn = ToyConnection(guard())
    transport = RecordingTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger=log.name):
        conn.data_received(hello[:HANDSHAKE_BYTES])
    assert conn.errors_counted == ["bad_handshake"] and conn.closed and transport.closing
    assert f"closing toy connection 10.0.0.1:5: {words}" in caplog.text
    replies = len(transport.written)
    conn.data_received(Hello(Service.STORAGE, 1, 2).encode() + frame(1))
    assert conn.taken == [] and len(transport.written) == replies


def test_a_malformed_frame_is_told_counted_and_closes_taking_nothing_after() -> None:
    conn, transport = connected()
    conn.data_received(frame(1) + frame(BAD_TYPE) + frame(2) + frame(3)[:5])
    assert conn.taken == [(1, b"body")]
    assert conn.told == ["ProtocolError: unknown message type 99"]
    assert conn.errors_counted == ["malformed"]
    assert conn.closed and transport.closing and not transport.aborted
    conn.data_received(frame(3)[5:] + frame(4))
    assert conn.taken == [(1, b"body")]
    # What was buffered went with the close: the end of the stream finds no frame cut.
    assert conn.eof_received() is False and conn.told == ["ProtocolError: unknown message type 99"]


def test_a_stream_that_ends_inside_a_frame_is_malformed() -> None:
    conn, transport = connected()
    conn.data_received(frame(1, b"x" * 100)[:50])
    assert conn.eof_received() is False
    assert conn.told == [
        "MalformedFrame: truncated frame: the stream ended inside it after 50 bytes"
    ]
    assert conn.errors_counted == ["malformed"] and transport.closing


def test_the_guard_refuses_a_connection_over_its_cap() -> None:
    peer_guard = guard(max_connections=1)
    first, _ = connected(peer_guard)
    first.data_received(frame(1))  # ready: its slot is its own
    second = ToyConnection(peer_guard)
    transport = RecordingTransport("10.0.0.2")
    second.connection_made(transport)  # type: ignore[arg-type]
    assert transport.aborted and second.closed and second.errors_counted == ["refused"]
    assert set(peer_guard.connections) == {first}


def test_a_newcomer_takes_the_slot_of_a_connection_not_ready_yet() -> None:
    peer_guard = guard(max_connections=1)
    stranger, stranger_transport = connected(peer_guard)
    newcomer, _ = connected(peer_guard, "10.0.0.2")
    assert stranger_transport.aborted and stranger.closed
    assert stranger.errors_counted == ["late"] and newcomer.errors_counted == []
    assert set(peer_guard.connections) == {newcomer}


def test_a_certificate_identity_refused_is_aborted_before_anything_is_read() -> None:
    peer_guard = guard()
    conn = ToyConnection(peer_guard, refuse_identity="not one of the servers")
    transport = RecordingTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    assert transport.aborted and transport.high_water is None
    assert conn.errors_counted == ["unauthorized"]
    conn.connection_lost(None)
    assert not peer_guard.connections


def test_close_for_aborts_and_the_guard_forgets_the_partial_frame_when_lost() -> None:
    peer_guard = guard()
    conn, transport = connected(peer_guard)
    conn.data_received(frame(1, b"x" * 1000)[:600])
    assert peer_guard.partial_bytes == 600
    conn.close_for("no first frame within 10 s of connecting")
    assert transport.aborted and conn.closed and conn.errors_counted == ["late"]
    conn.connection_lost(None)
    assert peer_guard.partial_bytes == 0 and not peer_guard.connections
    assert conn.eof_received() is False and conn.told == []


def test_an_idle_connection_keeps_no_backlog() -> None:
    """Frames wait in a deque only while some do: an idle connection holds none (an
    empty deque is 760 bytes, and a server holds a connection per client)."""
    conn, _ = connected()
    assert conn._backlog is None
    conn.hold = True
    conn.data_received(frame(1, b"a") + frame(2, b"b"))
    assert conn._backlog is not None and len(conn._backlog) == 2
    conn.release()
    assert conn.taken == [(1, b"a"), (2, b"b")] and conn._backlog is None
