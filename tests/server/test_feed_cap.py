"""The per-partition cap on feeds and mounts (max_feeds_per_partition) is exact.

Mounts queued at once used to pass the cap, as only running feeds were counted (11
connections x 1,000 clients: 11,000 mounts under a cap of 10,000). Here: the pure
slot count (``FeedSlots``) against a model, and a real server with a cap of 20 and raw
protocol connections: exactly 20 accepted, the next refused, a client re-mounting keeps
its one slot, and closing a connection frees its slots for others.
"""

from __future__ import annotations

import asyncio
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from waltz_client.wire.client_messages import (
    SERVER_PROTOCOL_VERSIONS,
    ErrorCode,
    ErrorResponse,
    MountRequest,
    MountResponse,
    decode_server_response,
)
from waltz_client.wire.framing import (
    HANDSHAKE_BYTES,
    FrameDecoder,
    HandshakeStatus,
    Hello,
    HelloReply,
    Service,
)
from waltz_client.wire.records import ReqId
from waltz_server.feed_slots import FeedSlots

pytestmark = pytest.mark.timeout(300)

# --- the pure count --------------------------------------------------------------------


def test_queued_mounts_hold_slots_and_a_client_holds_one():
    slots = FeedSlots(3)
    assert slots.mount_queued(1, "a") and slots.mount_queued(2, "a")
    assert slots.mount_queued(1, "b")  # client 1 again, on another connection: no new slot
    assert slots.used == 2
    assert slots.room_for_feed()
    slots.feed_started("feed")
    assert slots.used == 3
    assert not slots.mount_queued(3, "a")  # queued, not yet running: still counted
    assert not slots.room_for_feed()
    slots.mount_ran(1, "a", "m1a")
    slots.mount_ran(1, "b", "m1b")  # replaces m1a
    slots.feed_ended("m1a")  # the replaced feed ends: client 1 keeps its slot
    assert slots.used == 3
    slots.mount_ran(2, "a", None)  # refused when it ran (stale): its slot goes
    assert slots.used == 2 and slots.mount_queued(3, "c")
    slots.connection_closed("c")  # its queued Mount never runs
    slots.feed_ended("m1b")
    slots.feed_ended("feed")
    assert slots.used == 0
    with pytest.raises(ValueError, match="at least 1"):
        FeedSlots(0)


events = st.lists(
    st.tuples(
        st.sampled_from(["queue", "run_ok", "run_refused", "feed", "end", "close"]),
        st.integers(0, 4),  # client
        st.integers(0, 2),  # connection
    ),
    max_size=80,
)


@given(events)
def test_slots_match_a_model_of_queued_mounts_and_running_feeds(script):
    """The count is the number of read-only feeds plus the clients with a Mount queued
    or a mount feed running, never more than the cap, whatever the order of events."""
    cap = 4
    slots = FeedSlots(cap)
    queued: list[tuple[int, int]] = []  # (client, connection), in queue order
    mount_feed: dict[int, object] = {}  # client -> its running mount feed
    feeds: list[object] = []  # read-only feeds running
    ended: list[object] = []
    names = itertools.count()
    for op, client, conn in script:
        if op == "queue":
            holds = client in mount_feed or any(c == client for c, _ in queued)
            accepted = slots.mount_queued(client, conn)
            used = len(feeds) + len({c for c, _ in queued} | set(mount_feed))
            assert accepted == (holds or used < cap)
            if accepted:
                queued.append((client, conn))
        elif op in ("run_ok", "run_refused") and queued:
            c, k = queued.pop(0)
            feed = ("mount", next(names)) if op == "run_ok" else None
            slots.mount_ran(c, k, feed)
            if feed is not None:
                if c in mount_feed:
                    ended.append(mount_feed[c])
                mount_feed[c] = feed
        elif op == "feed":
            room = slots.room_for_feed()
            used = len(feeds) + len({c for c, _ in queued} | set(mount_feed))
            assert room == (used < cap)
            if room:
                feed = ("feed", next(names))
                slots.feed_started(feed)
                feeds.append(feed)
        elif op == "end":
            if feeds and client % 2:
                slots.feed_ended(feeds.pop(0))
            elif mount_feed:
                c = sorted(mount_feed)[client % len(mount_feed)]
                slots.feed_ended(mount_feed.pop(c))
            elif ended:
                slots.feed_ended(ended.pop())  # a replaced feed ending: no effect
        elif op == "close":
            slots.connection_closed(conn)
            queued = [(c, k) for c, k in queued if k != conn]
        used = len(feeds) + len({c for c, _ in queued} | set(mount_feed))
        assert slots.used == used <= cap


# --- a real server ---------------------------------------------------------------------

CAP = 20


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    low, high = min(SERVER_PROTOCOL_VERSIONS), max(SERVER_PROTOCOL_VERSIONS)
    writer.write(Hello(Service.SERVER, low, high).encode())
    reply = HelloReply.decode(await reader.readexactly(HANDSHAKE_BYTES))
    assert reply.status == HandshakeStatus.OK
    return reader, writer


class Answers:
    """Mount answers read from one connection, by ReqId."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self.reader = reader
        self.decoder = FrameDecoder(1 << 20)
        self.by_req: dict[ReqId, object] = {}

    async def wait(self, req_ids: list[ReqId]) -> list[str]:
        """READY or the error code's name, per request, in order."""
        async with asyncio.timeout(60):  # a hang guard; answers come in milliseconds
            while not all(q in self.by_req for q in req_ids):
                data = await self.reader.read(1 << 16)
                assert data, "the server closed the connection"
                for t, body in self.decoder.feed(data):
                    m = decode_server_response(t, body, 1 << 20)
                    if isinstance(m, (MountResponse, ErrorResponse)):
                        self.by_req[m.req_id] = m
        out = []
        for q in req_ids:
            m = self.by_req[q]
            if isinstance(m, MountResponse):
                out.append(m.status.name)
            else:
                assert isinstance(m, ErrorResponse)
                if m.code == ErrorCode.LIMIT_EXCEEDED:
                    assert "max_feeds_per_partition 20" in m.message, m.message
                out.append(m.code.name)
        return out


def test_the_partition_cap_is_exact_under_a_burst_and_frees_on_close(make_cluster):
    cluster = make_cluster(partitions=1, server_args=["--max-feeds-per-partition", str(CAP)])
    port = cluster.servers[0].ready["port"]
    generation = cluster.ownership()[0][1]
    seqs = itertools.count(1)

    def mount(client: int, connection_seq: int = 0) -> tuple[ReqId, bytes]:
        q = ReqId(client, generation, 0, next(seqs))
        return q, MountRequest(q, -1, connection_seq).encode()

    async def burst(writer, answers: Answers, clients: range) -> list[str]:
        requests = [mount(c) for c in clients]
        writer.write(b"".join(frame for _, frame in requests))  # queued at once
        return await answers.wait([q for q, _ in requests])

    async def go() -> None:
        conns = [await connect(port) for _ in range(3)]
        answers = [Answers(r) for r, _ in conns]
        # 12 + 12 + 6 new clients at once, on three connections: 30 for 20 slots.
        results = await asyncio.gather(
            burst(conns[0][1], answers[0], range(100, 112)),
            burst(conns[1][1], answers[1], range(200, 212)),
            burst(conns[2][1], answers[2], range(300, 306)),
        )
        flat = [r for rs in results for r in rs]
        assert flat.count("READY") == CAP, results
        assert flat.count("LIMIT_EXCEEDED") == 30 - CAP, results
        bursts = (range(100, 112), range(200, 212), range(300, 306))
        mounted = [
            c
            for rs, clients in zip(results, bursts, strict=True)
            for r, c in zip(rs, clients, strict=True)
            if r == "READY"
        ]
        # At the cap: a new client is refused; a mounted client mounting again is not
        # (on its connection, and on a new one with a newer connection sequence).
        extra_reader, extra_writer = await connect(port)
        extra = Answers(extra_reader)
        q, frame = mount(999, connection_seq=1)
        extra_writer.write(frame)
        assert await extra.wait([q]) == ["LIMIT_EXCEEDED"]
        again = mounted[0]
        home = next(i for i, cs in enumerate((100, 200, 300)) if cs <= again < cs + 100)
        q, frame = mount(again)
        conns[home][1].write(frame)
        assert await answers[home].wait([q]) == ["READY"]
        q, frame = mount(again, connection_seq=1)
        extra_writer.write(frame)
        assert await extra.wait([q]) == ["READY"]
        q, frame = mount(998, connection_seq=1)
        extra_writer.write(frame)
        assert await extra.wait([q]) == ["LIMIT_EXCEEDED"]  # still exactly at the cap

        # Closing the second connection frees its slots: as many new clients get in.
        freed = results[1].count("READY") - (home == 1)  # ``again`` moved away
        assert freed > 0
        conns[1][1].close()
        client = itertools.count(1000)
        async with asyncio.timeout(60):  # until the server has seen the close
            while True:
                q, frame = mount(next(client), connection_seq=1)
                extra_writer.write(frame)
                if await extra.wait([q]) == ["READY"]:
                    break
                await asyncio.sleep(0.05)
        requests = [mount(next(client), connection_seq=1) for _ in range(freed)]
        extra_writer.write(b"".join(frame for _, frame in requests))
        got = await extra.wait([q for q, _ in requests])
        assert got == ["READY"] * (freed - 1) + ["LIMIT_EXCEEDED"], got
        for _, writer in (*conns, (None, extra_writer)):
            writer.close()

    asyncio.run(go())
