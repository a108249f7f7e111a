"""A feed task that dies ends its subscription and tells the client.

Before, the dead task stayed registered: the client got no Feed Suspended, waited on a
feed that would never move, and its flushes were routed to it and never answered.
"""

from __future__ import annotations

import asyncio
import uuid

from waltz_client.wire.client_messages import (
    ClientMessageType,
    ErrorCode,
    FlushRequest,
    MountRequest,
    decode_server_response,
)
from waltz_client.wire.framing import FrameDecoder
from waltz_client.wire.records import RECORD_HEADER, ReqId
from waltz_server.partition import Partition, PartitionSettings, State
from waltz_server.recovery_manager import RecoveryContext


class Connection:
    """A client connection whose transport breaks on the first feed frame (as uvloop's
    raises RuntimeError on a transport that is closing)."""

    closed = False

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
            partition.feed_cache.add(txid, RECORD_HEADER.pack(txid, 7, 1, 0, 10 + txid, 0))
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
