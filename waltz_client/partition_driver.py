"""PartitionDriver: one partition's tasks, carrying out what its ``ClientPartition`` decides.

Three tasks run per partition. The mount loop follows the owner through ZooKeeper and runs
the spec's reconnect procedure (block appends, mount at the client high-water mark, let
the mount's answer settle every pending append, unblock). The inbox loop handles what the
stream brings for the partition, in order (feed data applied in commit order, never
skipping, never repeating; mount and flush answers; lock failures). The watchdog flushes
appends left unanswered. What the driver needs of its client (its connections, its
sequence numbers, the application's callbacks) comes in a ``DriverContext``, so that this
module does not import the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from .append import append_request
from .callbacks import WaltzClientCallbacks
from .client_partition import MAX_OWNER_WAIT, ClientPartition, Reaction
from .cluster_view import ClusterView
from .config import WaltzClientConfig
from .errors import Forbidden, MissingTransactions, WaltzError
from .monitor import Outcome, Resolution
from .runtime.tasks import wait_for
from .server_link import ServerLink
from .transaction import Transaction, TransactionBuilder
from .wire.client_messages import ClientMessage, FeedRows, FlushRequest, MountRequest
from .wire.records import NO_TIMESTAMP, ReqId
from .wire.server_connection import ServerConnection

# The client's logger: what a partition does is what the client does.
log = logging.getLogger("waltz_client.client")

# Seconds an append may go unanswered before a flush asks what became of it.
FLUSH_UNANSWERED_AFTER = 1.0

# Stream messages queued for one partition before its server's stream stops being read
# (each FeedData carries up to a few thousand headers).
MAX_INBOX = 64


class Pending(Protocol):
    """An append as the driver sees it: the attempt its verdict settles, and when it went."""

    attempt: asyncio.Future[Any] | None
    sent_at: float


S = TypeVar("S", bound=Pending)


def _sent_at(item: Pending) -> float:
    return item.sent_at


@dataclass(frozen=True)
class DriverContext:
    """What a partition's driver uses of its client (shared by all its partitions)."""

    config: WaltzClientConfig
    callbacks: WaltzClientCallbacks | None
    view: ClusterView
    link: Callable[[str], ServerLink]  # the link to the server at an endpoint
    ensure_client_id: Callable[[ServerLink], Awaitable[None]]
    next_seq: Callable[[], int]
    closed: Callable[[], bool]
    call: Callable[..., Awaitable[Any]]  # an application callback, on the loop or a thread
    high_water_mark: Callable[[int], Awaitable[int]]
    transaction_data: Callable[[int, int], Coroutine[Any, Any, bytes]]


@dataclass(eq=False)
class PartitionDriver(Generic[S]):
    """A partition's decisions (``core``) and the asyncio pieces that carry them out."""

    core: ClientPartition[S]
    window: asyncio.Semaphore  # appends under way (max_outstanding_appends)
    context: DriverContext
    link: ServerLink | None = None
    paused: ServerConnection | None = None  # the stream we stopped reading for this inbox
    ready: asyncio.Event = field(default_factory=asyncio.Event)  # appends may go out
    remount: asyncio.Event = field(default_factory=asyncio.Event)
    applied_changed: asyncio.Event = field(default_factory=asyncio.Event)
    inbox: asyncio.Queue[ClientMessage] = field(default_factory=asyncio.Queue)  # in order
    inbox_waiting: bool = False  # its loop waits for the next message, none in hand
    mount_answer: asyncio.Future[Any] | None = None
    mounted_at: tuple[str, int] | None = None  # (endpoint, generation) of the last READY
    left: tuple[str, int] | None = None  # ...whose server then suspended the feed
    refused: asyncio.Event = field(default_factory=asyncio.Event)  # core.refusal is set
    flush_answers: dict[ReqId, asyncio.Future[int]] = field(default_factory=dict)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    # This client's own commits whose apply_transaction raised: their submissions return
    # once the redelivered transaction is applied (submit's promise), in ID order.
    unapplied_commits: list[Resolution[S]] = field(default_factory=list)

    @property
    def partition_id(self) -> int:
        return self.core.partition_id

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Start the mount loop, the inbox loop and the watchdog."""
        loop = asyncio.get_running_loop()
        self.tasks = [
            loop.create_task(self._mount_loop()),
            loop.create_task(self._inbox_loop()),
            loop.create_task(self._watchdog()),
        ]

    def stop(self) -> None:
        """The client closes: wake waiting submissions, lose pending appends, cancel."""
        self.ready.set()  # submissions waiting for a mount wake and see the close
        for item in self.core.monitor.items():
            if item.attempt is not None and not item.attempt.done():
                item.attempt.set_result(Resolution(item, Outcome.LOST))
        _resolve(self.unapplied_commits)  # they did commit: say so, though not applied
        self.unapplied_commits.clear()
        for task in self.tasks:
            task.cancel()

    async def stopped(self) -> None:
        """Until the tasks ``stop`` cancelled have ended."""
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # --- mounting -----------------------------------------------------------------------

    async def client_high_water_mark(self) -> int:
        core = self.core
        if not core.applies:
            if not core.has_start_mark():
                # Watching only for our own appends: start at the end of the log.
                core.start_at(await self.context.high_water_mark(core.partition_id))
            return core.applied
        callbacks = self.context.callbacks
        assert callbacks is not None  # a partition is applied only with callbacks
        hwm = await self.context.call(callbacks.client_high_water_mark, core.partition_id)
        if not isinstance(hwm, int) or hwm < -1:
            raise WaltzError(f"client_high_water_mark({core.partition_id}) returned {hwm!r}")
        return hwm

    async def _watchdog(self) -> None:
        """Appends unanswered for ``FLUSH_UNANSWERED_AFTER`` get a flush: its answer
        settles any the server dropped without a trace (a stale generation, a lost store
        session). The server answers a flush only once every append before it is
        resolved, so an early one costs a message, never a wrong answer; waiting for
        ``request_timeout`` instead held a producer for 30 s after a storage node paused,
        though its partition had recovered within seconds."""
        loop = asyncio.get_running_loop()
        timeout = min(self.context.config.request_timeout, FLUSH_UNANSWERED_AFTER)
        period = max(0.05, timeout / 4)
        while True:
            await asyncio.sleep(period)
            if self.core.overdue(loop.time(), timeout, _sent_at):
                await self.flush()

    async def _mount_loop(self) -> None:
        ctx = self.context
        core = self.core
        p = core.partition_id
        while not ctx.closed():
            self.ready.clear()  # the reconnect procedure: appends wait
            core.remounting()
            owner = ctx.view.owner(p)
            if owner is not None and owner == self.left:
                # That server suspended this partition's feed: it serves it no more under
                # that generation. Wait for ZooKeeper to show where it went (a hand-over
                # writes it before the feeds are suspended) rather than ask it again.
                await ctx.view.changed(MAX_OWNER_WAIT)
                owner = ctx.view.owner(p)
            self.left = None
            if owner is None:
                await ctx.view.changed(1.0)
                continue
            endpoint, generation = owner
            try:
                link = ctx.link(endpoint)
                await ctx.ensure_client_id(link)
                conn = await link.stream_connection()
                hwm = await self.client_high_water_mark()
                self.link = link
                q = ReqId(ctx.view.client_id, generation, p, ctx.next_seq())
                core.mount_sent(q, hwm)
                self.mount_answer = asyncio.get_running_loop().create_future()
                self.remount.clear()
                conn.send(MountRequest(q, hwm, link.stream_seq))
                status = await wait_for(self.mount_answer, ctx.config.mount_timeout)
            except (Forbidden, MissingTransactions) as e:
                step = core.mount_failed(e)
                if core.refusal is e:
                    if step.new_refusal:
                        if isinstance(e, MissingTransactions):
                            log.error(
                                "partition %d: cannot mount: the application's high-water "
                                "mark is below the log start: %s",
                                p,
                                e,
                            )
                        else:
                            log.warning("partition %d: %s", p, e)
                    self.refused.set()
                if step.pause:
                    await asyncio.sleep(step.pause)
                continue
            except Exception as e:  # refused, timed out, a callback failing: retry it all
                step = core.mount_failed(e)
                log.info("partition %d: mounting at %s failed: %s", p, owner[0], e)
                # A server going away closes its connections as ZooKeeper shows its
                # partitions' new owners: mount there as soon as it does.
                if ctx.view.owner(p) == owner:
                    await ctx.view.changed(step.pause)
                continue
            step = core.mount_answered(status)
            if step.ready:
                self.mounted_at = owner
                self.refused.clear()
                self.ready.set()
                await self.remount.wait()
                continue
            log.info("partition %d: mount at %s answered %s", p, endpoint, status.name)
            if step.close_stream and link.stream is not None:
                await link.stream.close()
            if ctx.view.owner(p) == owner:  # else it moved meanwhile: mount there now
                await ctx.view.changed(step.pause)

    def stream_closed(self, link: ServerLink, conn: ServerConnection) -> None:
        """The stream connection ``conn`` of ``link`` closed: mount again if it was ours."""
        if self.link is link:
            self.remount.set()
            if self.mount_answer is not None and not self.mount_answer.done():
                self.core.mount_abandoned()
                self.mount_answer.set_exception(ConnectionError(conn.closed_reason or ""))

    async def mounted(self) -> None:
        """Until the partition is mounted; Forbidden if the access policy refuses it."""
        while not self.ready.is_set():
            if self.core.refusal is not None:
                raise self.core.refusal
            ready = asyncio.ensure_future(self.ready.wait())
            refused = asyncio.ensure_future(self.refused.wait())
            try:
                await asyncio.wait({ready, refused}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                ready.cancel()
                refused.cancel()

    async def applied_at_least(self, txid: int) -> None:
        """Until the lock's transaction is applied, or request_timeout (it may never
        commit: locks are taken when an ID is assigned): then retry anyway."""
        ctx = self.context
        deadline = asyncio.get_running_loop().time() + ctx.config.request_timeout
        while (
            self.core.applied < txid
            and not ctx.closed()
            and asyncio.get_running_loop().time() < deadline
        ):
            self.applied_changed.clear()
            with contextlib.suppress(TimeoutError):
                await wait_for(self.applied_changed.wait(), 1.0)

    async def flush(self) -> int | None:
        """Send a Flush under the current mount and wait for its answer (its high-water
        mark); None if the partition is not mounted or the Flush went unanswered."""
        link = self.link
        if link is None or link.stream is None or not self.ready.is_set():
            return None
        core = self.core
        q = ReqId(
            self.context.view.client_id, core.generation, core.partition_id, self.context.next_seq()
        )
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.flush_answers[q] = future
        core.flush_sent(q)
        try:
            link.stream.send(FlushRequest(q))
            return await wait_for(future, self.context.config.request_timeout)
        except (ConnectionError, TimeoutError, WaltzError):
            core.flush_abandoned(q)
            self.flush_answers.pop(q, None)
            return None

    # --- appends -----------------------------------------------------------------------

    def can_send(self) -> bool:
        """Mounted, on an open stream: an append may go out now."""
        link = self.link
        return self.ready.is_set() and link is not None and link.stream is not None

    def append(self, item: S, builder: TransactionBuilder) -> asyncio.Future[Resolution[S]]:
        """Send ``builder`` as ``item``'s Append (when ``can_send``); await the future
        returned for its verdict (a future, not a coroutine: one frame less to resume on
        every append's way back). The watchdog flushes if it takes too long."""
        link = self.link
        assert link is not None and link.stream is not None
        core = self.core
        q = ReqId(
            self.context.view.client_id,
            core.generation,
            core.partition_id,
            self.context.next_seq(),
        )
        loop = asyncio.get_running_loop()
        item.attempt = attempt = loop.create_future()
        core.monitor.sent(q, item)
        with contextlib.suppress(ConnectionError):  # a lost append: the next mount settles it
            link.stream.send(append_request(q, builder))
        item.sent_at = loop.time()
        return attempt

    # --- the stream: everything in order through the inbox ------------------------------

    def receive(self, m: ClientMessage) -> None:
        """A stream message for this partition, as its server's stream hands it over."""
        if type(m) is FeedRows and m.rows:  # committed up to its last row (PartitionStats)
            core = self.core
            core.lag.learned(m.rows[-1][0], time.monotonic(), core.applied)
        if (
            type(m) is FeedRows
            and self.inbox_waiting
            and self.inbox.empty()
            and not self.core.applies
        ):
            # Only watched for our own appends, and nothing before it waits: taken now,
            # not through the inbox's task (most feed a producer gets goes this way).
            try:
                self._watch_feed(m)
            except Exception:  # as the inbox's loop would: say so, mount again
                log.exception("partition %d: handling FeedData failed", self.partition_id)
                self.remount.set()
            return
        self.inbox.put_nowait(m)
        link = self.link
        if self.inbox.qsize() >= MAX_INBOX and link is not None and link.stream is not None:
            # The application applies slower than the feed arrives: stop reading this
            # server's stream until the inbox drains (its feeds then wait for us).
            link.stream.pause_reading()
            self.paused = link.stream

    async def _inbox_loop(self) -> None:
        while True:
            self.inbox_waiting = True
            try:
                m = await self.inbox.get()
            finally:
                self.inbox_waiting = False
            if self.paused is not None and self.inbox.qsize() <= MAX_INBOX // 2:
                self.paused.resume_reading()
                self.paused = None
            try:
                await self._handle(m)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception(
                    "partition %d: handling %s failed", self.partition_id, type(m).__name__
                )
                self.remount.set()

    async def _handle(self, m: ClientMessage) -> None:
        if isinstance(m, FeedRows):
            if self.core.is_current_feed(m.req_id):
                await self._deliver(m)
            return
        self._carry_out(self.core.receive(m))

    def _carry_out(self, reaction: Reaction[S]) -> None:
        """What the partition's core decided about a stream message."""
        _resolve(reaction.settled)
        if reaction.note:
            log.info("partition %d: %s", self.partition_id, reaction.note)
        if reaction.owner_gone:
            self.left = self.mounted_at
        if reaction.remount:
            self.remount.set()
        answer = self.mount_answer
        if answer is not None and not answer.done():
            if reaction.mount_status is not None:
                answer.set_result(reaction.mount_status)
            elif reaction.mount_error is not None:
                answer.set_exception(reaction.mount_error)
        if reaction.flush is not None:
            flushed = self.flush_answers.pop(reaction.flush, None)
            if flushed is not None and not flushed.done():
                if reaction.flush_error is not None:
                    flushed.set_exception(reaction.flush_error)
                else:
                    flushed.set_result(reaction.flush_high_water_mark)
            if reaction.flush_error is None:
                self.learned(reaction.flush_high_water_mark)

    def learned(self, high_water_mark: int) -> None:
        """A server said the partition's log reaches ``high_water_mark``."""
        core = self.core
        core.lag.learned(high_water_mark, time.monotonic(), core.applied)

    # --- the feed -----------------------------------------------------------------------

    def _watch_feed(self, m: FeedRows) -> None:
        """A feed on a partition not applied by the application: it only settles our own
        appends, without awaiting anything."""
        core = self.core
        before = core.applied
        try:
            taken = core.take_feed(m.req_id, m.rows, self.context.view.client_id)
            _resolve(taken.settled)
            if taken.gap is not None:
                self._feed_gap(taken.gap)
        finally:
            if core.applied != before:
                self.applied_changed.set()

    def _feed_gap(self, txid: int) -> None:
        """``txid`` is not the next transaction: the feed has a gap; mount again."""
        log.error(
            "partition %d: feed gap: %d after %d; mounting again",
            self.partition_id,
            txid,
            self.core.applied,
        )
        self.remount.set()

    async def _deliver(self, m: FeedRows) -> None:
        ctx = self.context
        callbacks = ctx.callbacks
        core = self.core
        if not core.applies or callbacks is None:
            self._watch_feed(m)
            return
        # Per row: the loop's lookups are made once (a catching-up consumer takes hundreds
        # of thousands of rows a second through here).
        commit_seen, delivered = core.commit_seen, core.delivered
        call, apply = ctx.call, callbacks.apply_transaction
        applied_changed, unapplied = self.applied_changed, self.unapplied_commits
        p, fetch, loop = core.partition_id, ctx.transaction_data, asyncio.get_running_loop()
        rows = m.rows
        span = core.deliverable(rows)
        for row in rows[span.start : span.stop]:
            txid, client_id, generation, partition_id, seq, header, timestamp = row
            q = ReqId(client_id, generation, partition_id, seq)
            resolutions = commit_seen(q, txid)
            txn = _transaction(loop, fetch, p, txid, header, q, timestamp)
            try:
                await call(apply, txn)
            except Exception as e:
                try:
                    await ctx.call(callbacks.uncaught_exception, core.partition_id, txid, e)
                except Exception:
                    log.exception("uncaught_exception itself raised")
                # Deliver it again: mount anew from the application's high-water mark
                # (unless a newer mount is already under way), ignoring the rest of
                # this mount's feed meanwhile. This client's own commit of it waits for
                # the redelivery to be applied; the appends it settles as lost go now.
                for r in resolutions:
                    if r.outcome is Outcome.COMMITTED:
                        self.unapplied_commits.append(r)
                    else:
                        _resolve([r])
                if core.feed_stopped(m.req_id):
                    self.remount.set()
                await asyncio.sleep(ctx.config.retry_backoff)
                return
            delivered(txid)
            applied_changed.set()
            if resolutions:
                _resolve(resolutions)
            if unapplied and unapplied[0].transaction_id <= txid:
                self._applied_at_last(txid)
        if span.gap is not None:
            core.feed_stopped(m.req_id)
            self._feed_gap(span.gap)

    def _applied_at_last(self, txid: int) -> None:
        """The application applied up to ``txid``: own commits waiting for it return."""
        waiting = self.unapplied_commits  # in place: _deliver holds it
        done = [r for r in waiting if r.transaction_id <= txid]
        waiting[:] = [r for r in waiting if r.transaction_id > txid]
        _resolve(done)


def _transaction(
    loop: asyncio.AbstractEventLoop,
    fetch: Callable[[int, int], Coroutine[Any, Any, bytes]],
    p: int,
    txid: int,
    header: int,
    req_id: ReqId,
    timestamp: int,
) -> Transaction:
    """A feed row as the application gets it: its data fetched on first use, from the
    loop or (``data_blocking``) from a worker thread; its commit time None where the row
    has none (an older server's feed)."""

    def blocking() -> bytes:
        return asyncio.run_coroutine_threadsafe(fetch(p, txid), loop).result()

    time = None if timestamp == NO_TIMESTAMP else timestamp
    return Transaction(txid, p, header, req_id, lambda: fetch(p, txid), blocking, time)


def _resolve(resolutions: list[Resolution[S]]) -> None:
    for r in resolutions:
        attempt = r.item.attempt
        if attempt is not None and not attempt.done():
            attempt.set_result(r)
