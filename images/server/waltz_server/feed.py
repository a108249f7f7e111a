"""A feed: one connection's stream of a partition's committed transaction headers.

From the client's high-water mark on, in order, from the feed cache or from storage,
laid out for the connection's protocol version (from 3 on with commit times);
Mount and Flush answers are queued on it behind the transactions they cover. A feed
that has to wait (a storage read, a full socket) does so in a task of its own, so a slow
reader waits for its own socket and stalls nobody else; an idle feed holds no task. A
feed that fails ends its subscription and tells its client (Feed Suspended).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections import deque
from typing import Protocol

from waltz_client.wire.client_messages import encode_feed_data
from waltz_client.wire.errors import describe
from waltz_client.wire.records import ReqId

from .caches import FeedCache

log = logging.getLogger(__name__)


class ClientConnection(Protocol):
    """What a partition needs of a client connection (server.py implements it)."""

    feeds: set[object]  # its subscriptions (feeds and mounts), for its cap
    # The client protocol version its handshake settled on: from 3 on, feed rows carry
    # commit times (``encode_feed_data``).
    version: int

    @property
    def closed(self) -> bool: ...

    def send(self, frame: bytes) -> None: ...

    @property
    def writable(self) -> bool:
        """Its socket takes more now (``drained`` would not wait)."""
        ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    async def drained(self) -> None: ...

    def mounted_seq(self, client_id: int, partition_id: int) -> int | None: ...

    def mark_mounted(self, client_id: int, partition_id: int, connection_seq: int) -> None: ...


class FeedSource(Protocol):
    """What a feed reads of its partition (partition.py implements it): feeds sit below
    the partition, which owns them."""

    partition_id: int
    feed_cache: FeedCache
    feed_sent: int  # headers sent on the partition's feeds, counted by each feed

    @property
    def healthy(self) -> bool:
        """Serving (not recovering or stopped): what it has committed may be sent."""
        ...

    @property
    def high_water_mark(self) -> int: ...

    @property
    def feed_batch(self) -> int:
        """The most headers sent in one Feed Data frame."""
        ...

    def truncated_for(self, txid: int) -> str | None: ...

    async def read_headers(self, start: int, stop: int) -> list[bytes]:
        """Headers ``start..stop`` packed as ``TIMED_HEADER`` ([]: none now)."""
        ...

    def end_truncated(self, sub: Subscription, reason: str) -> None: ...

    def end_subscription(self, sub: Subscription, reason: str) -> None: ...


class Subscription:
    """A connection's feed of one partition, from ``cursor`` on, with mount and flush
    answers queued behind the transactions they cover.

    A feed that has sent everything holds no task: commits are pushed to it in the call
    that committed them (``push``), and a task runs only while the feed has to wait
    (storage reads, a full socket, a partition recovering). Thousands of idle mounted
    clients then cost the server their state, not a parked task and its wake-up each."""

    __slots__ = (
        "_busy",
        "_context",
        "_ended",
        "connection",
        "cursor",
        "markers",
        "mounted",
        "partition",
        "req_id",
        "task",
        "version",
    )

    def __init__(
        self,
        partition: FeedSource,
        connection: ClientConnection,
        req_id: ReqId,
        client_high_water_mark: int,
        mounted: bool = False,
    ) -> None:
        self.mounted = mounted  # by a Mount (answers flushes), not a read-only Feed request
        self.partition = partition
        self.connection = connection
        self.version = connection.version  # its feed's layout (settled before any request)
        self.req_id = req_id
        self.cursor = client_high_water_mark + 1
        # Answers waiting for the transactions they cover; None when there are none (an
        # empty deque is 760 bytes, and most feeds have none most of the time).
        self.markers: deque[tuple[int, bytes]] | None = None
        # The running task, while the feed has to wait for something; None when idle.
        self.task: asyncio.Task[None] | None = None
        self._busy = False  # the task has started (a task only created is not yet)
        self._ended = False
        # The caller's context (its log fields name the partition), for every task.
        self._context = contextvars.copy_context()
        self.wake()  # from the client's high-water mark to the partition's

    def wake(self) -> None:
        """Something may be due (commits, answers, the partition serving again, a new
        log start): run the feed's task unless it runs already (it looks again at
        everything after each wait) or the feed has ended."""
        if self.task is None and not self._ended:
            self.task = asyncio.get_running_loop().create_task(self._run(), context=self._context)

    def stop(self) -> None:
        """End the feed: its task, if any, and every later wake."""
        self._ended = True
        if self.task is not None:
            self.task.cancel()

    def add_marker(self, through: int, frame: bytes, wake: bool = True) -> None:
        """Send ``frame`` once the feed has delivered every transaction up to ``through``
        (``wake``: False when a ``push`` follows at once)."""
        if self.markers is None:
            self.markers = deque()
        self.markers.append((through, frame))
        if wake:
            self.wake()

    def push(self) -> None:
        """New commits: when no task is at work (none, or one woken that has not run yet),
        the feed cache holds them and the socket takes more, send them now, in the turn
        that committed them; otherwise leave them to the task (which also reads storage
        and waits for the socket)."""
        if self._busy or self._ended:
            return  # the running task sees the new high-water mark after its wait
        p = self.partition
        connection = self.connection
        if connection.closed or not p.healthy:
            self.wake()
            return
        try:
            hwm = p.high_water_mark
            while self.cursor <= hwm and connection.writable:
                stop = min(hwm, self.cursor + p.feed_batch - 1)
                headers = p.feed_cache.get(self.cursor, stop)
                if not headers:
                    break
                self._deliver(headers)
            self._send_markers()
        except Exception as e:  # as in _run: end this feed, and say so to its client
            log.exception("partition %d: feed to a client failed", p.partition_id)
            self.stop()
            p.end_subscription(self, f"feed failed: {describe(e)}")
            return
        if self.cursor <= hwm or not connection.writable:
            self.wake()  # the rest is for the task: storage reads, a full socket

    def _deliver(self, headers: list[bytes]) -> None:
        """Send the next ``headers`` (from the cursor on) and move past them."""
        self.connection.send(encode_feed_data(self.req_id, headers, self.version))
        self.cursor += len(headers)
        self.partition.feed_sent += len(headers)

    def _send_markers(self) -> None:
        markers = self.markers
        if markers is None:
            return
        while markers and markers[0][0] < self.cursor:
            self.connection.send(markers.popleft()[1])
        if not markers:
            self.markers = None

    async def _run(self) -> None:
        """Send what is due, waiting where it must; end once nothing is left (no await
        between the last look and the end, so no wake is missed)."""
        p = self.partition
        self._busy = True
        try:
            while not self.connection.closed:
                hwm = p.high_water_mark
                gone = p.truncated_for(self.cursor)
                if gone is not None:
                    self._ended = True
                    p.end_truncated(self, gone)
                    return
                if self.cursor <= hwm and p.healthy:
                    stop = min(hwm, self.cursor + p.feed_batch - 1)
                    headers = await p.read_headers(self.cursor, stop)
                    if headers:
                        self._deliver(headers)
                        await self.connection.drained()
                        continue
                self._send_markers()
                if self.cursor <= p.high_water_mark and p.healthy:
                    continue
                return
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug: end this feed, and say so to its client
            log.exception("partition %d: feed to a client failed", p.partition_id)
            self._ended = True
            p.end_subscription(self, f"feed failed: {describe(e)}")
        finally:
            if self.task is asyncio.current_task():
                self.task = None
                self._busy = False
