"""One partition as this client sees it, and every decision about it, pure.

The client mounts each partition it writes to or follows (the spec's reconnect
procedure: appends wait, Mount at the client high-water mark, every append sent before
the Mount's answer is settled by it, appends go out again). ``ClientPartition`` holds
what that takes: the mount's phase and request, the last transaction delivered (the
applied high-water mark), the appends awaiting their fate (the transaction monitor),
the Flushes under way, and why the last mount was refused. It decides, message by
message from the partition's stream: which feed rows to deliver, seen before or a gap;
which appends a Mount, Flush, feed row, Lock Failure or refusal settles; when to mount
again; and, after each mount attempt, how long to wait before the next.

Nothing here does I/O, reads a clock, sleeps or logs: the asyncio shell
(``client.py``) and the deterministic simulator (``tests/simulation``) feed it the
messages their connections deliver and carry out what it returns. Pending appends are
opaque items chosen by the caller.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Generic, TypeVar

from .client_stats import FeedLag
from .errors import Forbidden, MissingTransactions, Unauthorized, WaltzError, truncated
from .monitor import Resolution, TransactionMonitor
from .submit_policy import Backoff
from .wire.client_messages import (
    ClientMessage,
    ErrorCode,
    ErrorResponse,
    FeedRow,
    FeedSuspended,
    FlushResponse,
    LockFailure,
    MountResponse,
    MountStatus,
)
from .wire.records import ReqId

T = TypeVar("T")

# After a refused mount (the access policy, the log start), the next try waits at least
# this long: the refusal changes only when an operator or the application acts.
REFUSED_MOUNT_PAUSE = 1.0
# After a mount answered NOT_OWNER, STALE_GENERATION or STALE_CONNECTION, wait at most
# this long for ZooKeeper to show the change before mounting again.
MAX_OWNER_WAIT = 1.0


class MountPhase(Enum):
    UNMOUNTED = "unmounted"  # no mount under way: appends wait
    MOUNTING = "mounting"  # a Mount sent, its answer awaited
    MOUNTED = "mounted"  # answered READY: the feed flows, appends may go out


@dataclass(frozen=True, slots=True)
class FeedSpan:
    """Which rows of a feed message to deliver: ``rows[start:stop]``, each the one after
    the row before it. The rows before ``start`` were delivered before (an overlap at a
    mount's start). ``gap``: the transaction ID found at ``stop`` where the next was due
    (transactions are missing: mount again); None when the message ends at ``stop``."""

    start: int
    stop: int
    gap: int | None


@dataclass(frozen=True)
class MountNext:
    """What the mount loop does after a mount attempt."""

    ready: bool = False  # mounted: let appends go, then wait for a reason to mount again
    pause: float = 0.0  # seconds before the next attempt
    until_view_changes: bool = False  # ...or less, if ZooKeeper shows a change sooner
    close_stream: bool = False  # STALE_CONNECTION: the next Mount goes on a new connection
    new_refusal: bool = False  # a refusal not seen before: say so once


@dataclass
class Reaction(Generic[T]):
    """What one stream message (other than feed rows) leads to."""

    settled: list[Resolution[T]] = field(default_factory=list)  # appends now decided
    remount: bool = False  # mount again
    # ...elsewhere: the server of this mount stopped serving the partition (it suspended
    # the feed), so the next mount waits for ZooKeeper to show the partition's new owner
    # or generation rather than ask that server again.
    owner_gone: bool = False
    note: str = ""  # why, when worth telling (the partition's feed stopped)
    # The answer to the mount under way: its status, or the error that refused it.
    mount_status: MountStatus | None = None
    mount_error: WaltzError | None = None
    # A Flush answered: the partition's high-water mark, or why it failed.
    flush: ReqId | None = None
    flush_high_water_mark: int = -1
    flush_error: WaltzError | None = None


@dataclass
class FeedTaken(Generic[T]):
    """A feed message taken whole (a partition only watched for this client's appends)."""

    settled: list[Resolution[T]] = field(default_factory=list)
    gap: int | None = None  # the transaction ID that broke the order: mount again


@dataclass(frozen=True)
class _Flush:
    sent_before: set[ReqId]  # the appends pending when it was sent
    mount: ReqId | None  # the mount it was sent under


class ClientPartition(Generic[T]):
    def __init__(self, partition_id: int, applies: bool, first_backoff: float) -> None:
        self.partition_id = partition_id
        # Whether the application applies the feed (else it is only watched for this
        # client's appends, from the end of the log).
        self.applies = applies
        self.phase = MountPhase.UNMOUNTED
        self.generation = -1
        self.mount_req: ReqId | None = None
        # A mount whose feed stopped at an application failure: the rest of it is ignored.
        self.broken_mount: ReqId | None = None
        self.applied = -1  # the last transaction ID delivered (and applied, when applying)
        self.monitor: TransactionMonitor[T] = TransactionMonitor()
        # A feed row: ``req_id`` committed as ``transaction_id``; it returns the appends of
        # this client it settles (that one, and every one sent before it). The monitor's
        # method itself: a layer between costs a call on every feed row.
        self.commit_seen: Callable[[ReqId, int], list[Resolution[T]]] = self.monitor.committed
        # Why the last mount was refused (FORBIDDEN, TRUNCATED); None once one succeeds.
        self.refusal: WaltzError | None = None
        self.backoff = Backoff(first_backoff)  # between mount attempts
        self._flushes: dict[ReqId, _Flush] = {}
        # What is known committed beyond the applied mark (PartitionStats), and counts of
        # this client's retries and lock failures on the partition.
        self.lag = FeedLag()
        self.retries = 0
        self.lock_failures = 0

    # --- mounting -----------------------------------------------------------------------

    def has_start_mark(self) -> bool:
        """Whether a watched partition knows where its feed starts (a mount set it, or
        the log's end was read)."""
        return self.mount_req is not None or self.applied != -1

    def start_at(self, high_water_mark: int) -> None:
        """A watched partition starts at the end of the log: its high-water mark now."""
        self.applied = high_water_mark

    def remounting(self) -> None:
        """The reconnect procedure begins: appends wait until the next mount answers."""
        self.phase = MountPhase.UNMOUNTED

    def mount_sent(self, req_id: ReqId, client_high_water_mark: int) -> None:
        """A Mount went out: its feed starts after ``client_high_water_mark``."""
        if req_id.generation != self.generation:
            # A new owner: the pauses grown while the old one was unreachable say nothing
            # of it. The first refusal of a new owner is most often a server that has not
            # yet read the ownership change its client saw: it is asked again soon.
            self.backoff.reset()
        self.generation = req_id.generation
        self.applied = client_high_water_mark
        self.mount_req = req_id
        self.phase = MountPhase.MOUNTING

    def mount_abandoned(self) -> None:
        """Its answer is no longer awaited (timed out, connection closed)."""
        if self.phase is MountPhase.MOUNTING:
            self.phase = MountPhase.UNMOUNTED

    def mount_answered(self, status: MountStatus) -> MountNext:
        """The mount under way was answered ``status``."""
        if status == MountStatus.READY:
            self.backoff.reset()
            self.refusal = None
            return MountNext(ready=True)
        return MountNext(
            pause=min(MAX_OWNER_WAIT, self.backoff.grow()),
            until_view_changes=True,
            close_stream=status == MountStatus.STALE_CONNECTION,
        )

    def mount_failed(self, error: Exception) -> MountNext:
        """The attempt failed before an answer: refused (``Forbidden``,
        ``MissingTransactions``), or anything else (refused connection, timeout, a
        failing callback), which is simply tried again."""
        self.mount_abandoned()
        if not isinstance(error, Forbidden | MissingTransactions):
            return MountNext(pause=self.backoff.grow())
        if isinstance(error, MissingTransactions) and not self.applies:
            # Only watching for this client's (recent) appends: go on from the log start.
            self.applied = max(self.applied, error.first_available - 1)
            return MountNext()
        # The policy may change, the application may restore from a snapshot: try again,
        # a little later; meanwhile appends fail with the reason.
        new = self.refusal is None or str(self.refusal) != str(error)
        self.refusal = error
        return MountNext(pause=max(self.backoff.grow(), REFUSED_MOUNT_PAUSE), new_refusal=new)

    # --- the feed -----------------------------------------------------------------------

    def is_current_feed(self, req_id: ReqId) -> bool:
        """Whether a feed message belongs to the current mount (and was not cut short by
        an application failure)."""
        return req_id == self.mount_req and req_id != self.broken_mount

    def deliverable(self, rows: Sequence[FeedRow]) -> FeedSpan:
        """The rows of a feed message to deliver, judged once for the message against the
        applied mark (a catching-up consumer takes hundreds of thousands of rows a
        second: no call per row). A row that goes back after the first delivered one is
        a gap too: the server broke the order."""
        applied, count = self.applied, len(rows)
        start = 0
        while start < count and rows[start][0] <= applied:
            start += 1
        stop, expected = start, applied + 1
        while stop < count and rows[stop][0] == expected:
            stop += 1
            expected += 1
        return FeedSpan(start, stop, rows[stop][0] if stop < count else None)

    def delivered(self, transaction_id: int) -> None:
        """The application applied the transaction (or nobody applies this partition)."""
        self.applied = transaction_id

    def feed_stopped(self, feed_req_id: ReqId) -> bool:
        """The feed of ``feed_req_id`` stopped short of what the server sent
        (``apply_transaction`` raised, or a row was missing): the rest of it is ignored,
        and the transaction is delivered again by a new mount. Whether to mount again
        (not when a newer mount is under way already)."""
        if self.mount_req != feed_req_id:
            return False
        self.broken_mount = feed_req_id
        return True

    def take_feed(
        self, feed_req_id: ReqId, rows: Sequence[FeedRow], own_client_id: int
    ) -> FeedTaken[T]:
        """A whole feed message of a partition nobody applies: it only moves the mark and
        settles this client's appends (every ReqId it sends carries ``own_client_id``)."""
        taken: FeedTaken[T] = FeedTaken()
        if not self.is_current_feed(feed_req_id):
            return taken  # an older mount's feed
        span = self.deliverable(rows)
        monitor = self.monitor
        if monitor:
            for row in rows[span.start : span.stop]:
                if row[1] == own_client_id:  # most rows are other clients': not unpacked
                    txid, client_id, generation, partition_id, seq, _, _ = row
                    req_id = ReqId(client_id, generation, partition_id, seq)
                    taken.settled += monitor.committed(req_id, txid)
        if span.stop > span.start:
            self.applied = rows[span.stop - 1][0]
        if span.gap is not None:
            taken.gap = span.gap
            self.feed_stopped(feed_req_id)
        return taken

    # --- flushes ------------------------------------------------------------------------

    def flush_sent(self, req_id: ReqId) -> None:
        self._flushes[req_id] = _Flush(self.monitor.pending_ids(), self.mount_req)

    def flush_abandoned(self, req_id: ReqId) -> None:
        """Its answer is no longer awaited (timed out, connection failed)."""
        self._flushes.pop(req_id, None)

    def overdue(self, now: float, timeout: float, sent_at: Callable[[T], float]) -> bool:
        """Whether the oldest pending append went unanswered for longer than ``timeout``:
        a Flush's answer then settles any the server dropped without a trace (a stale
        generation, a lost store session)."""
        oldest = min((sent_at(item) for item in self.monitor.items()), default=None)
        return oldest is not None and now - oldest > timeout

    # --- everything else the stream brings ----------------------------------------------

    def receive(self, m: ClientMessage) -> Reaction[T]:
        """A Mount or Flush answer, a Lock Failure, Feed Suspended or an Error Response
        for this partition, in stream order (feed rows go to ``row`` or ``take_feed``)."""
        q = m.req_id
        match m:
            case MountResponse(status=status) if q == self.mount_req:
                # Every append sent before the mount is settled: pending ones are lost
                # (those that committed came on its feed first, unless that stopped short).
                ready = status == MountStatus.READY
                settled = self.monitor.mounted() if ready and self._feed_whole(q) else []
                if self.phase is not MountPhase.MOUNTING:
                    return Reaction(settled)  # an answer nobody waits for any more
                self.phase = MountPhase.MOUNTED if ready else MountPhase.UNMOUNTED
                return Reaction(settled, mount_status=status)
            case LockFailure(transaction_id=txid):
                return Reaction(_listed(self.monitor.lock_failed(q, txid)))
            case FlushResponse(transaction_id=txid) if q in self._flushes:
                flush = self._flushes.pop(q)
                # Only the mount it was sent under can say which appends are lost: after a
                # remount, the new mount's answer settles them instead.
                settles = flush.mount == self.mount_req and self._feed_whole(flush.mount)
                settled = self.monitor.flushed(flush.sent_before) if settles else []
                return Reaction(settled, flush=q, flush_high_water_mark=txid)
            case FeedSuspended(reason=reason) if q == self.mount_req:
                return Reaction(remount=True, owner_gone=True, note=f"feed suspended: {reason}")
            case ErrorResponse() if q == self.mount_req:
                if self.phase is not MountPhase.MOUNTING:
                    # The feed of a settled mount ended (its next transaction went with
                    # retention): mount again, which says why.
                    return Reaction(remount=True, note=f"feed ended: {m.message}")
                self.phase = MountPhase.UNMOUNTED
                return Reaction(mount_error=self._mount_refusal(m))
            case ErrorResponse() if q in self.monitor:
                return Reaction(_listed(self.monitor.refused(q, f"{m.code.name}: {m.message}")))
            case ErrorResponse() if q in self._flushes:
                flush = self._flushes.pop(q)
                return Reaction(
                    # The server rebuilt the partition (a new object never saw this
                    # mount): mount anew; its answer settles the appends.
                    remount=m.code == ErrorCode.NOT_MOUNTED and flush.mount == self.mount_req,
                    flush=q,
                    flush_error=WaltzError(f"flush: {m.code.name}: {m.message}"),
                )
        return Reaction()

    def _feed_whole(self, mount: ReqId | None) -> bool:
        """Whether the feed of ``mount`` delivered everything it was sent. A Mount or
        Flush answer comes behind the rows it covers, so only then may it call the
        appends still pending lost: after a feed stopped short, one of them may have
        committed in a row that was ignored, and the next mount's answer settles them."""
        return mount != self.broken_mount

    def _mount_refusal(self, m: ErrorResponse) -> WaltzError:
        if m.code == ErrorCode.TRUNCATED:
            return truncated(self.partition_id, self.applied + 1, m)
        kind = {ErrorCode.FORBIDDEN: Forbidden, ErrorCode.UNAUTHORIZED: Unauthorized}.get(
            m.code, WaltzError
        )
        return kind(f"mount: {m.code.name}: {m.message}")


def _listed(resolution: Resolution[T] | None) -> list[Resolution[T]]:
    return [] if resolution is None else [resolution]
