"""Over TLS, the frames of one loop turn leave as one TLS record, not one a buffer.

uvloop's TLS transport encrypts each buffer ``writelines`` gets as a record of its own,
and the peer decrypts each on its own: a turn of ten frames, each written as a head and
a body, cost twenty records. The writers join the buffers first (``write_buffers``).
Measured through a relay that counts the records of the client's stream, on a real TLS
connection (uvloop, certificates from the local CA).
"""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import pytest

from waltz_client.runtime import event_loop
from waltz_client.runtime.tls import TlsContexts, TlsFiles
from waltz_client.tools.local.certs import local_pki
from waltz_client.wire.corked import CorkedWriter, coalesced, is_tls, write_buffers

APPLICATION_DATA = 23
FRAMES = 10
HEAD, BODY = b"h" * 9, b"b" * 1000


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, TlsFiles]:
    hosts = ["127.0.0.1", "localhost"]
    return local_pki(str(tmp_path / "pki"), {"waltz-server-0": hosts, "client": hosts})


class RecordCounter:
    """TLS records seen in one direction of a stream, by their 5-byte headers."""

    def __init__(self) -> None:
        self._pending = b""
        self.application_data = 0
        self.seen = asyncio.Event()

    def feed(self, data: bytes) -> None:
        self._pending += data
        while len(self._pending) >= 5:
            kind, _, length = struct.unpack(">BHH", self._pending[:5])
            if len(self._pending) < 5 + length:
                return
            self._pending = self._pending[5 + length :]
            if kind == APPLICATION_DATA:
                self.application_data += 1
        self.seen.set()


async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, count=None) -> None:
    while data := await reader.read(65536):
        if count is not None:
            count.feed(data)
        writer.write(data)
        await writer.drain()
    writer.close()


async def records_for_one_turn(pki: dict[str, TlsFiles], flush) -> tuple[int, bytes]:
    """(TLS records the client's stream gained, what the server read) for FRAMES frames
    written as head and body in one turn, handed to the transport by ``flush``."""
    received = bytearray()
    expected = FRAMES * (len(HEAD) + len(BODY))
    done = asyncio.Event()

    accepted = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set()  # the handshake is done: the client's last records passed the relay
        while len(received) < expected and (data := await reader.read(65536)):
            received.extend(data)
        done.set()
        await reader.read()
        writer.close()

    listening = TlsContexts(pki["waltz-server-0"], listening=True)
    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=listening.listening_context())
    server_port = server.sockets[0].getsockname()[1]
    counter = RecordCounter()

    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", server_port)
        await asyncio.gather(relay(reader, up_writer, counter), relay(up_reader, writer))

    relay_server = await asyncio.start_server(forward, "127.0.0.1", 0)
    relay_port = relay_server.sockets[0].getsockname()[1]
    context = TlsContexts(pki["client"], listening=False).current()
    _, writer = await asyncio.open_connection("127.0.0.1", relay_port, ssl=context)
    transport = writer.transport
    assert is_tls(transport)
    await asyncio.wait_for(accepted.wait(), 30)
    before = counter.application_data
    flush(transport, [part for _ in range(FRAMES) for part in (HEAD, BODY)])
    await asyncio.wait_for(done.wait(), 30)
    records = counter.application_data - before
    writer.close()
    for s in (relay_server, server):
        s.close()
    return records, bytes(received)


def corked(transport: asyncio.WriteTransport, parts: list[bytes]) -> None:
    out = CorkedWriter(transport)
    out.writelines(parts)
    out.flush()


@pytest.mark.parametrize(
    "flush",
    [corked, write_buffers],
    ids=["CorkedWriter", "write_buffers"],
)
def test_a_turn_of_frames_is_one_tls_record(pki, flush) -> None:
    records, received = event_loop.run(records_for_one_turn(pki, flush))
    assert received == (HEAD + BODY) * FRAMES  # the same bytes, in order
    assert records == 1


def test_plain_writelines_would_make_a_record_of_each_buffer(pki) -> None:
    """What the join avoids, on the same connection: the check above can fail."""

    def writelines(transport: asyncio.WriteTransport, parts: list[bytes]) -> None:
        transport.writelines(parts)

    records, received = event_loop.run(records_for_one_turn(pki, writelines))
    assert received == (HEAD + BODY) * FRAMES
    assert records == 2 * FRAMES


def test_small_buffers_are_joined_and_large_ones_left_as_they_are() -> None:
    """A range read's records (a buffer of a TLS record or more) are not copied: only
    the runs of small buffers around them are joined."""
    big = memoryview(b"r" * 20000)
    assert coalesced([b"a", b"b", big, b"c", b"d", b"e"]) == [b"ab", big, b"cde"]
    assert coalesced([big, b"x"]) == [big, b"x"]
    assert coalesced([b"only"]) == [b"only"]
    assert coalesced([]) == []
    joined = coalesced([b"a", b"b", big, b"c", b"d", b"e"])
    assert joined[1] is big  # not copied


def test_plain_text_keeps_the_buffers_apart() -> None:
    """Without TLS the buffers go to writelines as they are (no copy: the kernel
    gathers them), so records read from disk are never joined into a frame."""

    class Transport(asyncio.WriteTransport):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[tuple[str, object]] = []

        def writelines(self, list_of_data) -> None:  # type: ignore[override]
            self.calls.append(("writelines", list(list_of_data)))

        def write(self, data) -> None:  # type: ignore[override]
            self.calls.append(("write", data))

    transport = Transport()
    body = memoryview(b"records")
    write_buffers(transport, [b"head", body])
    assert transport.calls == [("writelines", [b"head", body])]
