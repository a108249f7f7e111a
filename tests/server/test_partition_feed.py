"""A partition's feeds, with a fake client connection.

A feed task that dies ends its subscription and tells the client. Before, the dead task
stayed registered: the client got no Feed Suspended, waited on a feed that would never
move, and its flushes were routed to it and never answered.

A commit is pushed to the feeds waiting for it in the same call, with the answers queued
behind it; a feed whose socket is full is left to its task.
"""

from __future__ import annotations

import asyncio
import uuid

from waltz_client.wire.client_messages import (
    ClientMessageType,
    ErrorCode,
    FeedData,
    FlushRequest,
    FlushResponse,
    MountRequest,
    MountResponse,
    decode_server_response,
)
from waltz_client.wire.framing import FrameDecoder
from waltz_client.wire.records import (
    CRC,
    FORMAT_2,
    TIMED_HEADER,
    RecordBatch,
    ReqId,
    crc32,
)
from waltz_server.partition import Partition, PartitionSettings, State
from waltz_server.recovery_manager import RecoveryContext


class Connection:
    """A client connection whose transport breaks on the first feed frame (as uvloop's
    raises RuntimeError on a transport that is closing)."""

    closed = False
    version = 3  # the client protocol it speaks: feed rows with commit times

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.broken = True
        self.feeds: set[object] = set()

    def send(self, frame: bytes) -> None:
        if self.broken and frame[4] == ClientMessageType.FEED_DATA:
            self.broken = False
            raise RuntimeError("unable to perform operation on <TCPTransport closed=True>")
        self.frames.append(frame)

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    writable = True

    async def drained(self) -> None: ...

    def mounted_seq(self, client_id: int, partition_id: int) -> int | None:
        return 1

    def mark_mounted(self, client_id: int, partition_id: int, connection_seq: int) -> None: ...

    def messages(self) -> list:
        decoder = FrameDecoder(1 << 20)
        return [
            decode_server_response(t, b, 1 << 20) for f in self.frames for t, b in decoder.feed(f)
        ]


def test_a_dead_feed_is_suspended_and_no_longer_answers_flushes() -> None:
    async def scenario() -> None:
        context = RecoveryContext(0, 1, ("s:1",), uuid.uuid4(), 1, metadata=None)  # type: ignore[arg-type]
        partition = Partition(context, PartitionSettings())
        partition.state = State.ACTIVE
        partition.core.session_opened(2)
        for txid in range(3):
            partition.feed_cache.add(txid, TIMED_HEADER.pack(txid, 7, 1, 0, 10 + txid, 0, 5000))
        connection = Connection()
        q = ReqId(7, 1, 0, 1)
        partition._mount(connection, MountRequest(q, -1, 1))
        (sub,) = partition.subscriptions
        await asyncio.wait_for(sub.task, 30)
        assert sub not in partition.subscriptions
        (suspended,) = connection.messages()
        assert (
            suspended.req_id == q and "feed failed: unable to perform operation" in suspended.reason
        )
        # A flush from that client now gets a clear refusal, not silence.
        partition._flush(connection, FlushRequest(ReqId(7, 1, 0, 2)))
        error = connection.messages()[-1]
        assert error.code == ErrorCode.NOT_MOUNTED

    asyncio.run(scenario())


def committed_batch(first: int, count: int) -> RecordBatch:
    """Records ``first..first+count-1`` as a store session hands a commit over."""
    buf, spans = b"", []
    for txid in range(first, first + count):
        data = b"d%d" % txid
        spans.append((txid, len(buf), len(data)))
        buf += FORMAT_2.head.pack(txid, 7, 1, 0, 100 + txid, 0, len(data), 5000 + txid)
        buf += data + CRC.pack(crc32(data))
    return RecordBatch(buf, spans)


async def mounted_partition(connection: Connection) -> Partition:
    """An active partition with nothing committed, ``connection`` mounted on it and its
    feed task parked (nothing left to send)."""
    context = RecoveryContext(0, 1, ("s:1",), uuid.uuid4(), 1, metadata=None)  # type: ignore[arg-type]
    partition = Partition(context, PartitionSettings())
    partition.state = State.ACTIVE
    partition.core.session_opened(-1)
    partition.feed_cache.reset(-1)
    partition._mount(connection, MountRequest(ReqId(7, 1, 0, 1), -1, 1))
    for _ in range(10):
        await asyncio.sleep(0)
    assert [type(m) for m in connection.messages()] == [MountResponse]
    return partition


def test_a_commit_is_pushed_to_a_waiting_feed_in_the_same_call() -> None:
    async def scenario() -> None:
        connection = Connection()
        connection.broken = False
        partition = await mounted_partition(connection)
        partition._flush(connection, FlushRequest(ReqId(7, 1, 0, 2)))
        partition._committed(committed_batch(0, 3), 0.0)
        # No turn of the loop in between: the feed and the flush it settles are sent.
        feed, flush = connection.messages()[1:]
        assert isinstance(feed, FeedData) and [h.transaction_id for h in feed.headers] == [0, 1, 2]
        # The flush, queued before the commit (it covered no append of this client's),
        # goes out in the same call instead of waiting for the task.
        assert isinstance(flush, FlushResponse) and flush.transaction_id == -1
        for _ in range(10):
            await asyncio.sleep(0)
        assert len(connection.messages()) == 3  # nothing more to send
        (sub,) = partition.subscriptions
        assert sub.cursor == 3 and sub.task is None  # an idle feed holds no task

    asyncio.run(scenario())


def test_a_feed_whose_socket_is_full_is_left_to_its_task() -> None:
    async def scenario() -> None:
        connection = Connection()
        connection.broken = False
        partition = await mounted_partition(connection)
        (sub,) = partition.subscriptions
        assert sub.task is None  # idle: no task
        connection.writable = False
        partition._committed(committed_batch(0, 2), 0.0)
        assert len(connection.messages()) == 1  # nothing pushed past a full socket
        assert sub.task is not None  # the task waits for the socket
        connection.writable = True
        for _ in range(10):
            await asyncio.sleep(0)
        feed = connection.messages()[1]
        assert isinstance(feed, FeedData) and [h.transaction_id for h in feed.headers] == [0, 1]
        assert sub.task is None  # done, and idle again

    asyncio.run(scenario())
