"""A feed: one connection's stream of a partition's committed transaction headers.

From the client's high-water mark on, in order, from the feed cache or from storage,
laid out for the connection's protocol version (from 3 on with commit times);
Mount and Flush answers are queued on it behind the transactions they cover. One task
per feed, so a slow reader waits for its own socket and stalls nobody else. A feed that
fails ends its subscription and tells its client (Feed Suspended).
"""

from __future__ import annotations

import asyncio
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
    answers queued behind the transactions they cover."""

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
        self.markers: deque[tuple[int, bytes]] = deque()
        self.wake = asyncio.Event()
        self._parked = False  # the task waits for ``wake`` with nothing left to send
        self.task = asyncio.get_running_loop().create_task(self._run())

    def add_marker(self, through: int, frame: bytes, wake: bool = True) -> None:
        """Send ``frame`` once the feed has delivered every transaction up to ``through``
        (``wake``: False when a ``push`` follows at once)."""
        self.markers.append((through, frame))
        if wake:
            self.wake.set()

    def push(self) -> None:
        """New commits: when the task is parked waiting for them, the feed cache holds
        them and the socket takes more, send them now, in the turn that committed them;
        otherwise wake the task (which also reads storage and waits for the socket).
        Saves a wake of the task and a turn of the loop on every commit."""
        p = self.partition
        connection = self.connection
        if not self._parked or connection.closed or not p.healthy:
            self.wake.set()
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
            self.task.cancel()
            p.end_subscription(self, f"feed failed: {describe(e)}")
            return
        if self.cursor <= hwm or not connection.writable:
            self.wake.set()  # the rest is for the task: storage reads, a full socket

    def _deliver(self, headers: list[bytes]) -> None:
        """Send the next ``headers`` (from the cursor on) and move past them."""
        self.connection.send(encode_feed_data(self.req_id, headers, self.version))
        self.cursor += len(headers)
        self.partition.feed_sent += len(headers)

    def _send_markers(self) -> None:
        while self.markers and self.markers[0][0] < self.cursor:
            self.connection.send(self.markers.popleft()[1])

    async def _run(self) -> None:
        p = self.partition
        try:
            while not self.connection.closed:
                hwm = p.high_water_mark
                gone = p.truncated_for(self.cursor)
                if gone is not None:
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
                self.wake.clear()
                if self.cursor <= p.high_water_mark and p.healthy:
                    continue
                self._parked = True
                try:
                    await self.wake.wait()
                finally:
                    self._parked = False
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug: end this feed, and say so to its client
            log.exception("partition %d: feed to a client failed", p.partition_id)
            p.end_subscription(self, f"feed failed: {describe(e)}")
