"""The append task's decisions for one partition, pure.

Appends, Mounts and Flushes reach the partition through one queue, in arrival order;
``PartitionCore`` decides each in turn: whether an append is stale (an old generation,
or a connection older than the client's newest mount) or conflicts with a lock, which
transaction ID it gets (locks are taken at assignment), which Mounts are accepted and
which mount feed a client's Flush is answered on, and when Mount and Flush barriers
resolve (every append queued before them committed, or decided by a new session).

Connections and feeds are opaque keys chosen by the asyncio shell (``partition.py``),
which does the sending. Nothing here does I/O or reads a clock, so tests and the
simulator drive it event by event; collections are dicts and lists, so the order of
what it returns is deterministic.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from waltz_client.wire.client_messages import MountStatus
from waltz_client.wire.records import ReqId

from .lock_table import LockTable


@dataclass(frozen=True)
class Ignored:
    """An append from an older generation or a superseded connection: dropped silently
    (the client learns it from its next Mount or Flush)."""

    reason: str


@dataclass(frozen=True)
class LockConflict:
    transaction_id: int  # the lock estimate above the client's high-water mark


@dataclass(frozen=True)
class Assigned:
    transaction_id: int


@dataclass(frozen=True)
class Resolved:
    """A barrier resolved: send ``token``'s answer on ``feed`` once the feed has
    delivered every transaction up to ``through``."""

    feed: Hashable
    token: object
    through: int


@dataclass
class _Barrier:
    target: int  # the last transaction ID assigned when it was queued
    epoch: int  # the store session it was queued in
    client_id: int
    feed: Hashable
    token: object


class PartitionCore:
    def __init__(self, generation: int, lock_table_size: int, lock_hashes: int) -> None:
        self.generation = generation
        self.high_water_mark = -1
        self.next_transaction_id = 0
        self.epoch = 0  # bumped by every new store session
        self.locks = LockTable(lock_table_size, lock_hashes)
        self._newest_mount: dict[int, int] = {}  # client ID -> newest connection seq
        # Open connections on which each client mounted here, and the reverse: a client's
        # newest mount is forgotten once none is open (no append can then carry an older
        # mount), so the table holds connected clients, not every client ever seen.
        # Tuples, not sets: a client has a connection or two, and a set is 216 bytes empty.
        self._mounted_on: dict[int, tuple[Hashable, ...]] = {}
        self._clients_on: dict[Hashable, tuple[int, ...]] = {}
        self._mount_feeds: dict[int, tuple[Hashable, Hashable]] = {}  # client -> (conn, feed)
        self._client_of_feed: dict[Hashable, int] = {}  # the same, feed -> client: O(1) ends
        self._barriers: list[_Barrier] = []

    # --- store sessions -------------------------------------------------------------

    def session_opened(self, high_water_mark: int, keep_locks: bool = False) -> list[Resolved]:
        """A new store session starts from ``high_water_mark``: IDs continue from it, and
        barriers of the old session resolve (whatever it had not committed is now
        decided).

        ``keep_locks``: every transaction up to the mark took its locks in this table
        (this object ran the session that wrote last, so nobody else wrote since the
        table was last reset). The table is kept, minus the transactions the recovery
        dropped: a client behind the mark conflicts only on locks taken after its own
        mark. Otherwise the history is unknown and every lock is as new as the log."""
        self.high_water_mark = high_water_mark
        self.next_transaction_id = high_water_mark + 1
        if keep_locks:
            self.locks.truncate(high_water_mark)
        else:
            self.locks.reset(high_water_mark)
        self.epoch += 1
        return self._resolve()

    def committed(self, last_transaction_id: int) -> list[Resolved]:
        self.high_water_mark = last_transaction_id
        self.locks.settled(last_transaction_id)
        return self._resolve() if self._barriers else []

    # --- requests, in queue order ---------------------------------------------------

    def append(
        self,
        req_id: ReqId,
        connection_mount_seq: int | None,
        client_high_water_mark: int,
        write_locks: Sequence[int],
        read_locks: Sequence[int],
        append_locks: Sequence[int],
    ) -> Ignored | LockConflict | Assigned:
        """``connection_mount_seq``: the connection sequence number under which this
        client's Mount of the partition was accepted on the append's connection (None if
        it never mounted there)."""
        if req_id.generation != self.generation:
            return Ignored(f"generation {req_id.generation}, not {self.generation}")
        newest = self._newest_mount.get(req_id.client_id, -1)
        if connection_mount_seq is not None and connection_mount_seq < newest:
            return Ignored(f"connection {connection_mount_seq} superseded by {newest}")
        conflict = self.locks.conflict(client_high_water_mark, (*write_locks, *read_locks))
        if conflict is not None:
            return LockConflict(conflict)
        txid = self.next_transaction_id
        self.next_transaction_id += 1
        self.locks.commit(txid, (*write_locks, *append_locks))
        return Assigned(txid)

    def mount(
        self,
        req_id: ReqId,
        connection_seq: int,
        connection: Hashable,
        feed: Hashable,
        token: object,
    ) -> tuple[MountStatus, Hashable | None]:
        """(status, the client's previous mount feed to end). READY: ``feed`` becomes the
        client's mount feed, and ``token`` resolves once every append queued so far is."""
        if req_id.generation != self.generation:
            return MountStatus.STALE_GENERATION, None
        if connection_seq < self._newest_mount.get(req_id.client_id, -1):
            return MountStatus.STALE_CONNECTION, None
        self._newest_mount[req_id.client_id] = connection_seq
        connections = self._mounted_on.get(req_id.client_id, ())
        if connection not in connections:
            self._mounted_on[req_id.client_id] = (*connections, connection)
        clients = self._clients_on.get(connection, ())
        if req_id.client_id not in clients:
            self._clients_on[connection] = (*clients, req_id.client_id)
        previous = self._mount_feeds.get(req_id.client_id)
        if previous is not None:
            self._client_of_feed.pop(previous[1], None)
        self._mount_feeds[req_id.client_id] = (connection, feed)
        self._client_of_feed[feed] = req_id.client_id
        self._barrier(req_id.client_id, feed, token)
        return MountStatus.READY, previous[1] if previous is not None else None

    def flush(self, req_id: ReqId, connection: Hashable, token: object) -> bool:
        """A Flush is answered on its client's mount feed on the same connection, after
        the transactions it covers. False: there is none (never mounted here, or mounted
        in an earlier partition object): the answer could not say which appends this
        object's recovery committed, so it is refused (NOT_MOUNTED)."""
        current = self._mount_feeds.get(req_id.client_id)
        if current is None or current[0] != connection:
            return False
        self._barrier(req_id.client_id, current[1], token)
        return True

    def feed_ended(self, feed: Hashable) -> None:
        """A mount feed ended (its connection closed, or it failed): flushes are no longer
        answered on it."""
        client_id = self._client_of_feed.pop(feed, None)
        if client_id is not None:
            current = self._mount_feeds.get(client_id)
            if current is not None and current[1] == feed:
                del self._mount_feeds[client_id]

    def connection_closed(self, connection: Hashable) -> None:
        """Forget the newest mount of each client with no other open connection that
        mounted here."""
        for client_id in self._clients_on.pop(connection, ()):
            others = tuple(c for c in self._mounted_on[client_id] if c != connection)
            if others:
                self._mounted_on[client_id] = others
            else:
                del self._mounted_on[client_id]
                del self._newest_mount[client_id]

    @property
    def clients_tracked(self) -> int:
        """Clients whose newest mount is remembered (those with an open connection)."""
        return len(self._newest_mount)

    # --- barriers -------------------------------------------------------------------

    def _barrier(self, client_id: int, feed: Hashable, token: object) -> None:
        self._barriers.append(
            _Barrier(self.next_transaction_id - 1, self.epoch, client_id, feed, token)
        )

    def resolve(self) -> list[Resolved]:
        """Barriers that resolve now (call after queueing one)."""
        return self._resolve()

    def _resolve(self) -> list[Resolved]:
        resolved, keep = [], []
        for b in self._barriers:
            if self.high_water_mark >= b.target or self.epoch > b.epoch:
                current = self._mount_feeds.get(b.client_id)
                if current is not None and current[1] == b.feed:  # not replaced or ended
                    resolved.append(Resolved(b.feed, b.token, min(b.target, self.high_water_mark)))
            else:
                keep.append(b)
        self._barriers = keep
        return resolved
