"""The cap on one partition's feeds and mounts at once, pure.

A read-only feed (a Feed request) holds a slot while it runs. A client's mount holds one
slot from the moment its first Mount is queued until the client has neither a Mount
queued nor a mount feed running here: however many Mounts it sends, on however many
connections, it holds one slot, because each accepted Mount replaces the client's
previous mount feed (``PartitionCore.mount``). A queued Mount holds its slot before it
runs, so a burst of Mounts queued at once cannot pass the cap: checking only the running
feeds let 11 connections x 1,000 clients queue 11,000 Mounts under a cap of 10,000.

The asyncio shell (``partition.py``) reports each event; feeds and connections are
opaque keys. No I/O, no clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable


class FeedSlots:
    def __init__(self, cap: int) -> None:
        if cap < 1:
            raise ValueError(f"a partition's feed cap must be at least 1, got {cap}")
        self.cap = cap
        self._feeds: set[Hashable] = set()  # read-only feeds running
        self._holds: Counter[int] = Counter()  # client -> Mounts queued + its mount feed
        self._queued: dict[Hashable, Counter[int]] = {}  # connection -> client -> queued
        self._mount_feed: dict[int, Hashable] = {}  # client -> its running mount feed
        self._client_of: dict[Hashable, int] = {}  # the same, feed -> client

    @property
    def used(self) -> int:
        """Slots held: read-only feeds, and clients with a mount queued or running."""
        return len(self._feeds) + len(self._holds)

    def room_for_feed(self) -> bool:
        return self.used < self.cap

    def feed_started(self, feed: Hashable) -> None:
        """A read-only feed runs (after ``room_for_feed``, with nothing awaited between)."""
        self._feeds.add(feed)

    def mount_queued(self, client_id: int, connection: Hashable) -> bool:
        """A Mount of ``client_id`` is queued on ``connection``; False: refused, the cap
        is reached (a client that already holds a slot always gets in)."""
        if client_id not in self._holds and self.used >= self.cap:
            return False
        self._holds[client_id] += 1
        self._queued.setdefault(connection, Counter())[client_id] += 1
        return True

    def mount_ran(self, client_id: int, connection: Hashable, feed: Hashable | None) -> None:
        """A queued Mount ran: accepted with its mount ``feed`` (which replaces the
        client's previous one), or refused (None)."""
        queued = self._queued.get(connection)
        if queued is None or queued[client_id] <= 0:
            return  # released already: its connection closed
        queued[client_id] -= 1
        if not queued[client_id]:
            del queued[client_id]
            if not queued:
                del self._queued[connection]
        if feed is None:
            self._release(client_id)
            return
        previous = self._mount_feed.get(client_id)
        if previous is not None:
            # The queued Mount's hold passes to the new feed; the previous feed's goes.
            del self._client_of[previous]
            self._release(client_id)
        self._mount_feed[client_id] = feed
        self._client_of[feed] = client_id

    def feed_ended(self, feed: Hashable) -> None:
        """A feed ended (dropped, replaced, failed, its connection closed); a feed
        already replaced or ended is ignored."""
        if feed in self._feeds:
            self._feeds.discard(feed)
            return
        client_id = self._client_of.pop(feed, None)
        if client_id is not None:
            del self._mount_feed[client_id]
            self._release(client_id)

    def connection_closed(self, connection: Hashable) -> None:
        """The Mounts still queued on ``connection`` will never run: their holds go."""
        for client_id, count in self._queued.pop(connection, Counter()).items():
            self._release(client_id, count)

    def clear(self) -> None:
        """The partition stopped: every feed ended, every queued Mount was answered."""
        self._feeds.clear()
        self._holds.clear()
        self._queued.clear()
        self._mount_feed.clear()
        self._client_of.clear()

    def _release(self, client_id: int, count: int = 1) -> None:
        left = self._holds[client_id] - count
        if left > 0:
            self._holds[client_id] = left
        else:
            del self._holds[client_id]
