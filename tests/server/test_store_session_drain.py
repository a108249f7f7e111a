"""A store session's drain (a planned end) wakes on the commit it waits for, not on a poll.

The members are fake storage clients whose Append answers the test releases.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from waltz_client.wire.records import CRC, FORMAT_2, crc32
from waltz_client.wire.storage_messages import SuccessResponse
from waltz_server.store_session import Member, StoreSession


class FakeClient:
    """Holds each Append's answer until the test releases it."""

    closed = False

    def __init__(self) -> None:
        self.pending: list[tuple[int, Callable]] = []
        self._seq = 0

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def send_parts(self, seq: int, parts: list, on_answer: Callable) -> None:
        self.pending.append((seq, on_answer))

    def answer_all(self, session_id: int, partition_id: int) -> None:
        for seq, on_answer in self.pending:
            on_answer(SuccessResponse(session_id, seq, partition_id), None)
        self.pending.clear()

    async def close(self) -> None:
        self.closed = True


def record(txid: int, data: bytes = b"x") -> bytes:
    head = FORMAT_2.head.pack(txid, 1, 1, 0, txid, 0, len(data), 1_800_000_000_000 + txid)
    return head + data + CRC.pack(crc32(data))


async def settle(rounds: int = 20) -> None:
    """Let the loop run what is ready, without letting any time pass on purpose."""
    for _ in range(rounds):
        await asyncio.sleep(0)


def start(members: int = 3) -> tuple[StoreSession, dict[str, FakeClient], list[int]]:
    clients = {f"s{i}:1": FakeClient() for i in range(members)}
    commits: list[int] = []
    session = StoreSession(
        0,
        7,
        {a: Member(a, c) for a, c in clients.items()},  # type: ignore[arg-type]
        members,
        -1,
        lambda batch, started: commits.append(batch.last_txid),
    )
    return session, clients, commits


def test_drain_returns_as_soon_as_the_last_record_commits() -> None:
    async def scenario() -> None:
        session, clients, commits = start()
        for txid in range(3):
            session.append(txid, record(txid), 1)
        await settle()  # the writer sends the batch
        drain = asyncio.create_task(session.drain(60.0))
        await settle()
        assert not drain.done()  # nothing acknowledged yet
        clients["s0:1"].answer_all(7, 0)
        await settle()
        assert not drain.done()  # one of three: no quorum
        clients["s1:1"].answer_all(7, 0)
        # Woken by the commit: done within a few loop rounds (a poll would still sleep).
        await settle()
        assert drain.done() and commits == [2]
        await session.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_drain_returns_when_the_session_ends_or_at_the_timeout() -> None:
    async def scenario() -> None:
        session, _, _ = start()
        session.append(0, record(0), 1)
        await settle()
        drain = asyncio.create_task(session.drain(60.0))
        await settle()
        assert not drain.done()
        session.end("a member failed")
        await settle()
        assert drain.done()
        await session.close()

        session, _, _ = start()
        session.append(0, record(0), 1)
        await settle()
        await asyncio.wait_for(session.drain(0.05), 30)  # nothing answers: the timeout
        assert not session.core.drained()
        await session.close()

        session, _, _ = start()
        await asyncio.wait_for(session.drain(60.0), 30)  # nothing queued: at once
        await session.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))
