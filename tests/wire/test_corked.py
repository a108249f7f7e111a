"""CorkedWriter: the frames of one loop turn reach the transport in one writelines call,
in the order written; a flush hands them over at once."""

from __future__ import annotations

import asyncio

from waltz_client.wire.corked import CorkedWriter


class RecordingTransport(asyncio.WriteTransport):
    """Records each writelines call (a stand-in for the socket's transport)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[bytes]] = []
        self.closing = False

    def writelines(self, list_of_data) -> None:  # type: ignore[override]
        self.calls.append([bytes(part) for part in list_of_data])

    def write(self, data) -> None:  # type: ignore[override]
        raise AssertionError("CorkedWriter writes with writelines only")

    def is_closing(self) -> bool:
        return self.closing


def test_frames_of_one_turn_leave_in_one_call_in_order() -> None:
    async def go() -> list[list[bytes]]:
        transport = RecordingTransport()
        out = CorkedWriter(transport)
        out.write(b"a")
        out.writelines([b"b", memoryview(b"c")])
        out.write(bytearray(b"d"))
        assert transport.calls == []  # nothing yet: the flush runs on the next turn
        assert out.pending == 4
        await asyncio.sleep(0)
        out.write(b"e")  # a later turn: a call of its own
        await asyncio.sleep(0)
        return transport.calls

    assert asyncio.run(go()) == [[b"a", b"b", b"c", b"d"], [b"e"]]


def test_flush_hands_over_at_once_and_the_scheduled_flush_then_does_nothing() -> None:
    async def go() -> list[list[bytes]]:
        transport = RecordingTransport()
        out = CorkedWriter(transport)
        out.write(b"reply")
        out.flush()  # before a close, say
        assert transport.calls == [[b"reply"]]
        assert out.pending == 0
        await asyncio.sleep(0)
        return transport.calls

    assert asyncio.run(go()) == [[b"reply"]]


def test_nothing_is_written_to_a_closing_transport() -> None:
    async def go() -> list[list[bytes]]:
        transport = RecordingTransport()
        out = CorkedWriter(transport)
        out.write(b"late")
        transport.closing = True
        await asyncio.sleep(0)
        return transport.calls

    assert asyncio.run(go()) == []


def test_frames_from_several_tasks_in_one_turn_share_the_call() -> None:
    """As when a storage group commits and every partition's session answers its clients."""

    async def go() -> list[list[bytes]]:
        transport = RecordingTransport()
        out = CorkedWriter(transport)
        wake = asyncio.Event()

        async def partition(name: bytes) -> None:
            await wake.wait()
            out.write(name)

        tasks = [asyncio.create_task(partition(bytes([65 + i]))) for i in range(4)]
        await asyncio.sleep(0)
        wake.set()
        await asyncio.gather(*tasks)
        await asyncio.sleep(0)
        return transport.calls

    assert asyncio.run(go()) == [[b"A", b"B", b"C", b"D"]]
