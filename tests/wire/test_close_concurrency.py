"""Closing a connection from two tasks while one of them is cancelled.

The close waiter of an asyncio stream is one future shared by every ``wait_closed()``:
a task cancelled while waiting on it used to cancel it for everyone, and the other
``close()`` raised CancelledError. Found by the simulator: a partition stopping while
its session loop was closing the same store session failed to stop (its feeds were
never suspended).
"""

from __future__ import annotations

import asyncio

from waltz_client.wire.framing import HANDSHAKE_BYTES, HandshakeStatus, HelloReply
from waltz_client.wire.storage_client import StorageClient


def test_a_cancelled_close_does_not_break_a_concurrent_close():
    drain = asyncio.Event()

    async def storage_stub(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(HANDSHAKE_BYTES)
        writer.write(HelloReply(HandshakeStatus.OK, 1).encode())
        await drain.wait()  # until then the client's close waits for its buffer to flush
        while await reader.read(1 << 20):
            pass
        writer.close()

    async def scenario() -> None:
        server = await asyncio.start_server(storage_stub, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = await StorageClient.connect("127.0.0.1", port)
        client.submit_frame(1, b"x" * (64 << 20))  # more than the socket buffers take
        first = asyncio.create_task(client.close())
        await asyncio.sleep(0.2)
        second = asyncio.create_task(client.close())
        await asyncio.sleep(0.2)
        assert not first.done() and not second.done()  # both wait for the close
        first.cancel()
        await asyncio.sleep(0.05)
        drain.set()
        await asyncio.wait_for(second, 30)  # raised CancelledError before the fix
        assert client.closed
        server.close()
        await server.wait_closed()

    asyncio.run(scenario())
