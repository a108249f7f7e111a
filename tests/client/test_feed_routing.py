"""Where a partition's feed goes when it arrives: straight to the transaction monitor, or
through the partition's inbox.

A producer's partition (no application callbacks) only settles its own appends from
the feed, so a FeedData is taken as it arrives, but only when the inbox's loop waits
with nothing queued: anything already queued (a Mount answer, an earlier feed) is
handled first, in order. A partition the application applies always goes through the
inbox, whose loop awaits the callbacks. These drive a real client's stream handler
with real messages; no server is needed to decide the route.
"""

from __future__ import annotations

import asyncio

from waltz_client import WaltzClient, WaltzClientCallbacks, WaltzClientConfig
from waltz_client.client import _Partition, _Submission
from waltz_client.client_partition import ClientPartition
from waltz_client.monitor import Outcome
from waltz_client.submit_policy import SubmissionRetries
from waltz_client.wire.client_messages import FeedRows, MountResponse, MountStatus
from waltz_client.wire.records import NO_TIMESTAMP, ReqId

CLIENT = 7
MOUNT = ReqId(CLIENT, 1, 0, 1)


class Applies(WaltzClientCallbacks):
    async def client_high_water_mark(self, partition_id: int) -> int:
        return -1

    async def apply_transaction(self, transaction) -> None:
        pass


def feed(*entries: tuple[int, int]) -> FeedRows:
    """Headers of (transaction ID, append seq) written by this client, as its stream
    connection decodes them."""
    return FeedRows(MOUNT, tuple((t, CLIENT, 1, 0, s, 0, NO_TIMESTAMP) for t, s in entries))


def producer(callbacks: WaltzClientCallbacks | None = None) -> tuple[WaltzClient, _Partition]:
    config = WaltzClientConfig("127.0.0.1:1", feed=callbacks is not None)
    client = WaltzClient(config, callbacks)
    client.view.client_id = CLIENT  # as start() would have it
    state = _Partition(
        ClientPartition(0, callbacks is not None, 0.05),
        asyncio.Semaphore(8),
        client._driver_context,
    )
    state.core.mount_req = MOUNT
    client._partitions[0] = state
    return client, state


def pending(state: _Partition, seq: int) -> asyncio.Future:
    future = asyncio.get_running_loop().create_future()
    sub = _Submission(None, 0, future, SubmissionRetries(1, 0.05))  # type: ignore[arg-type]
    sub.attempt = asyncio.get_running_loop().create_future()
    state.core.monitor.sent(ReqId(CLIENT, 1, 0, seq), sub)
    return sub.attempt


def test_a_producers_feed_settles_appends_as_it_arrives() -> None:
    async def go() -> None:
        client, state = producer()
        first, second = pending(state, 10), pending(state, 11)
        state.inbox_waiting = True
        client._on_stream_message(feed((0, 10), (1, 11)))
        assert state.inbox.empty()  # not queued: taken now
        assert first.result().outcome == Outcome.COMMITTED
        assert (second.result().outcome, second.result().transaction_id) == (
            Outcome.COMMITTED,
            1,
        )
        assert state.core.applied == 1 and state.applied_changed.is_set()

    asyncio.run(go())


def test_the_feed_waits_its_turn_behind_the_inbox() -> None:
    async def go() -> None:
        client, state = producer()
        attempt = pending(state, 10)
        # The inbox's loop is handling a message: the feed queues behind it.
        state.inbox_waiting = False
        client._on_stream_message(feed((0, 10)))
        assert state.inbox.qsize() == 1 and not attempt.done()
        # The loop waits, but a Mount answer is queued first: the feed queues too.
        state.inbox_waiting = True
        client._on_stream_message(MountResponse(MOUNT, MountStatus.READY))
        client._on_stream_message(feed((1, 11)))
        assert state.inbox.qsize() == 3 and not attempt.done()

    asyncio.run(go())


def test_an_applied_partitions_feed_goes_through_the_inbox() -> None:
    async def go() -> None:
        client, state = producer(Applies())
        attempt = pending(state, 10)
        state.inbox_waiting = True
        client._on_stream_message(feed((0, 10)))
        assert state.inbox.qsize() == 1 and not attempt.done()

    asyncio.run(go())


def test_a_gap_or_an_old_mounts_feed_settles_nothing() -> None:
    async def go() -> None:
        client, state = producer()
        attempt = pending(state, 10)
        state.inbox_waiting = True
        client._on_stream_message(
            FeedRows(ReqId(CLIENT, 0, 0, 1), ((0, CLIENT, 1, 0, 10, 0, NO_TIMESTAMP),))
        )
        assert not attempt.done() and state.core.applied == -1  # an older mount's feed
        client._on_stream_message(feed((0, 9), (2, 10)))  # transaction 1 is missing
        assert state.core.applied == 0 and state.remount.is_set()
        assert not attempt.done()  # the next mount settles it
        assert state.applied_changed.is_set()  # transaction 0 was taken

    asyncio.run(go())


def test_other_clients_transactions_move_the_mark_and_settle_nothing_of_ours() -> None:
    """A feed carries every client's transactions. Another client's append with the
    same generation, partition and seq as one of ours is not ours; ours, after it,
    settles only itself."""

    async def go() -> None:
        client, state = producer()
        attempt = pending(state, 10)
        state.inbox_waiting = True
        other = CLIENT + 1
        client._on_stream_message(FeedRows(MOUNT, ((0, other, 1, 0, 10, 0, NO_TIMESTAMP),)))
        assert state.core.applied == 0 and not attempt.done()
        rows = ((1, other, 1, 0, 11, 0, 5), (2, CLIENT, 1, 0, 10, 0, 6))
        client._on_stream_message(FeedRows(MOUNT, rows))
        assert state.core.applied == 2
        assert (attempt.result().outcome, attempt.result().transaction_id) == (
            Outcome.COMMITTED,
            2,
        )

    asyncio.run(go())
