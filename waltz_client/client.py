"""WaltzClient: submit transaction contexts, apply the committed feed, read ranges.

One asyncio client per process (a blocking facade wraps it for threaded code). This is
the shell: it moves messages and time, and every decision about a partition (its mount,
its feed's order, what settles each append, when to mount again) is taken by the pure
``ClientPartition``; what follows each attempt of a submission, by
``SubmissionRetries``. Per server the client keeps a ``ServerLink`` (a stream connection
for mounts, appends, the feed and flushes; an RPC connection for the requests in
``rpc.py``). Per partition three tasks run: the mount loop follows the owner through
ZooKeeper and runs the spec's reconnect procedure (block appends, mount at the client
high-water mark, let the mount's answer settle every pending append, unblock); the
inbox loop handles what the stream brings, in order (feed data applied in commit order,
never skipping, never repeating; mount and flush answers; lock failures); the watchdog
flushes appends left unanswered. The client's ID comes from the first server it mounts
at (AllocateClientId), once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import itertools
import logging
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .append import append_request, size_problem
from .callbacks import WaltzClientCallbacks
from .client_partition import ClientPartition, Reaction, Row
from .cluster_view import ClusterView
from .config import WaltzClientConfig
from .errors import Forbidden, MissingTransactions, Unauthorized, WaltzError, truncated
from .monitor import Outcome, Resolution
from .rpc import PartitionRpc
from .runtime.tls import TlsContexts, tls_open_connection
from .server_link import ServerLink
from .submit_policy import Finish, RetryWhenApplied, SubmissionRetries, SubmitResult, SubmitStatus
from .transaction import Transaction, TransactionBuilder, TransactionContext
from .wire.client_messages import (
    CLIENT_ID_PROTOCOL_VERSION,
    AllocateClientIdRequest,
    ClientIdAllocated,
    ClientMessage,
    ErrorCode,
    ErrorResponse,
    FeedRows,
    FlushRequest,
    MountRequest,
)
from .wire.framing import OpenConnection
from .wire.records import Record, RecordBatch, ReqId, UncheckedRecords
from .wire.server_connection import ServerConnection

# Names applications import from here (they are defined next to what decides them).
__all__ = [
    "Forbidden",
    "MissingTransactions",
    "SubmitResult",
    "SubmitStatus",
    "Unauthorized",
    "WaltzClient",
    "WaltzError",
    "truncated",
]

log = logging.getLogger(__name__)

# Stream messages queued for one partition before its server's stream stops being read
# (each FeedData carries up to a few thousand headers).
MAX_INBOX = 64


class _StepFailed(Exception):
    """A submission's step that runs the application's code raised ``error``."""

    def __init__(self, step: str, error: Exception) -> None:
        super().__init__(f"{step} raised {error!r}")
        self.step = step
        self.error = error


@dataclass(eq=False)
class _Submission:
    context: TransactionContext
    partition_id: int
    result: asyncio.Future[SubmitResult]
    retries: SubmissionRetries
    attempt: asyncio.Future[Resolution[_Submission]] | None = None
    sent_at: float = 0.0


def _sent_at(sub: _Submission) -> float:
    return sub.sent_at


@dataclass(eq=False)
class _Partition:
    """A partition's decisions (``core``) and the asyncio pieces that carry them out."""

    core: ClientPartition[_Submission]
    window: asyncio.Semaphore  # appends under way (max_outstanding_appends)
    link: ServerLink | None = None
    paused: ServerConnection | None = None  # the stream we stopped reading for this inbox
    ready: asyncio.Event = field(default_factory=asyncio.Event)  # appends may go out
    remount: asyncio.Event = field(default_factory=asyncio.Event)
    applied_changed: asyncio.Event = field(default_factory=asyncio.Event)
    inbox: asyncio.Queue[ClientMessage] = field(default_factory=asyncio.Queue)  # in order
    inbox_waiting: bool = False  # its loop waits for the next message, none in hand
    mount_answer: asyncio.Future[Any] | None = None
    refused: asyncio.Event = field(default_factory=asyncio.Event)  # core.refusal is set
    flush_answers: dict[ReqId, asyncio.Future[int]] = field(default_factory=dict)
    tasks: list[asyncio.Task] = field(default_factory=list)

    @property
    def partition_id(self) -> int:
        return self.core.partition_id


class WaltzClient:
    def __init__(
        self, config: WaltzClientConfig, callbacks: WaltzClientCallbacks | None = None
    ) -> None:
        if not isinstance(config, WaltzClientConfig):
            raise TypeError(f"config must be a WaltzClientConfig, got {type(config).__name__}")
        if config.feed and callbacks is None:
            raise TypeError("callbacks are required unless WaltzClientConfig.feed is False")
        self.config = config
        self.callbacks = callbacks
        self.view = ClusterView(
            config.zookeeper, config.zk_root, config.zk_session_timeout, tls=config.zk_tls
        )
        self._links: dict[str, ServerLink] = {}
        self._partitions: dict[int, _Partition] = {}
        self._submissions: set[_Submission] = set()
        self._seqs = itertools.count(1)
        self._connection_seqs = itertools.count(1)
        self._client_id_lock = asyncio.Lock()  # one allocation at a time
        self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="waltz-callback")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        # How connections to servers are made: over TLS when the config says so.
        self.open_connection: OpenConnection = (
            tls_open_connection(TlsContexts(config.tls, listening=False))
            if config.tls is not None
            else asyncio.open_connection
        )
        self._rpc = PartitionRpc(
            config, self.view, self._link, self._next_seq, lambda: self._closed
        )

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> WaltzClient:
        self._loop = asyncio.get_running_loop()
        await self.view.start()
        if self.config.feed:
            wanted = self.config.partitions
            n = self.view.num_partitions
            missing = sorted(p for p in (wanted or ()) if p >= n)
            if missing:
                await self.close()
                raise WaltzError(
                    f"partitions {missing} do not exist (the cluster has {n}: 0..{n - 1})"
                )
            for p in sorted(wanted if wanted is not None else range(n)):
                self._partition(p, apply=True)
        return self

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for sub in list(self._submissions):
            self._finish(sub, sub.retries.failed("the client closed"))
        for state in self._partitions.values():
            state.ready.set()  # submissions waiting for a mount wake and see the close
            for sub in state.core.monitor.items():
                if sub.attempt is not None and not sub.attempt.done():
                    sub.attempt.set_result(Resolution(sub, Outcome.LOST))
            for task in state.tasks:
                task.cancel()
        for state in self._partitions.values():
            for task in state.tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        for link in self._links.values():
            await link.close()
        await self.view.stop()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def __aenter__(self) -> WaltzClient:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def client_id(self) -> int:
        return self.view.client_id

    @property
    def num_partitions(self) -> int:
        return self.view.num_partitions

    def applied_high_water_mark(self, partition_id: int) -> int:
        """The last transaction of the partition this client delivered to the application."""
        state = self._partitions.get(partition_id)
        return state.core.applied if state is not None else -1

    # --- callbacks, on the loop or on a worker thread -----------------------------------

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        if inspect.iscoroutinefunction(fn):
            return await fn(*args)
        assert self._loop is not None
        return await self._loop.run_in_executor(self._executor, fn, *args)

    async def _client_high_water_mark(self, state: _Partition) -> int:
        core = state.core
        if not core.applies:
            if not core.has_start_mark():
                # Watching only for our own appends: start at the end of the log.
                core.start_at(await self.high_water_mark(core.partition_id))
            return core.applied
        assert self.callbacks is not None  # a partition is applied only with callbacks
        hwm = await self._call(self.callbacks.client_high_water_mark, core.partition_id)
        if not isinstance(hwm, int) or hwm < -1:
            raise WaltzError(f"client_high_water_mark({core.partition_id}) returned {hwm!r}")
        return hwm

    # --- partitions: mounting -----------------------------------------------------------

    def _partition(self, partition_id: int, apply: bool) -> _Partition:
        state = self._partitions.get(partition_id)
        if state is None:
            core: ClientPartition[_Submission] = ClientPartition(
                partition_id, apply and self.callbacks is not None, self.config.retry_backoff
            )
            state = _Partition(core, asyncio.Semaphore(self.config.max_outstanding_appends))
            self._partitions[partition_id] = state
            loop = asyncio.get_running_loop()
            state.tasks = [
                loop.create_task(self._mount_loop(state)),
                loop.create_task(self._inbox_loop(state)),
                loop.create_task(self._watchdog(state)),
            ]
        return state

    async def _watchdog(self, state: _Partition) -> None:
        """Appends unanswered for ``request_timeout`` get a flush: its answer settles any
        the server dropped without a trace (a stale generation, a lost store session)."""
        loop = asyncio.get_running_loop()
        period = max(0.05, self.config.request_timeout / 4)
        while True:
            await asyncio.sleep(period)
            if state.core.overdue(loop.time(), self.config.request_timeout, _sent_at):
                await self._flush_partition(state)

    def _next_seq(self) -> int:
        return next(self._seqs)

    def _next_connection_seq(self) -> int:
        return next(self._connection_seqs)

    def _dialer(self, endpoint: str) -> OpenConnection:
        """How to reach the server at ``endpoint``: over TLS its certificate is checked for
        the name its registration gives (``ServerRegistration.tls_name``: on Kubernetes the
        cluster's client Service, while the host dialled is the pod's IP), else for the
        host dialled."""
        if self.config.tls is None:
            return self.open_connection
        host = endpoint.rpartition(":")[0]
        name = self.view.tls_name(endpoint)
        if name == host:
            return self.open_connection
        return functools.partial(self.open_connection, server_hostname=name)

    def _link(self, endpoint: str) -> ServerLink:
        link = self._links.get(endpoint)
        if link is None:
            link = self._links[endpoint] = ServerLink(
                endpoint,
                self._dialer,
                self._on_stream_message,
                self._stream_closed,
                self._next_connection_seq,
            )
        return link

    async def _mount_loop(self, state: _Partition) -> None:
        core = state.core
        p = core.partition_id
        while not self._closed:
            state.ready.clear()  # the reconnect procedure: appends wait
            core.remounting()
            owner = self.view.owner(p)
            if owner is None:
                await self.view.changed(1.0)
                continue
            endpoint, generation = owner
            try:
                link = self._link(endpoint)
                await self._ensure_client_id(link)
                conn = await link.stream_connection()
                hwm = await self._client_high_water_mark(state)
                state.link = link
                q = ReqId(self.client_id, generation, p, next(self._seqs))
                core.mount_sent(q, hwm)
                state.mount_answer = asyncio.get_running_loop().create_future()
                state.remount.clear()
                conn.send(MountRequest(q, hwm, link.stream_seq))
                status = await asyncio.wait_for(state.mount_answer, self.config.mount_timeout)
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
                    state.refused.set()
                if step.pause:
                    await asyncio.sleep(step.pause)
                continue
            except Exception as e:  # refused, timed out, a callback failing: retry it all
                step = core.mount_failed(e)
                log.info("partition %d: mounting at %s failed: %s", p, owner[0], e)
                await asyncio.sleep(step.pause)
                continue
            step = core.mount_answered(status)
            if step.ready:
                state.refused.clear()
                state.ready.set()
                await state.remount.wait()
                continue
            log.info("partition %d: mount at %s answered %s", p, endpoint, status.name)
            if step.close_stream and link.stream is not None:
                await link.stream.close()
            await self.view.changed(step.pause)

    async def _ensure_client_id(self, link: ServerLink) -> None:
        """Before the first Mount: get this client's ID from the server at ``link``."""
        if self.view.client_id >= 0:
            return
        async with self._client_id_lock:
            if self.view.client_id < 0:
                self.view.client_id = await self._allocate_client_id(link)
                log.info("client ID %d (from %s)", self.view.client_id, link.endpoint)

    async def _allocate_client_id(self, link: ServerLink) -> int:
        conn = await link.rpc_connection()
        if conn.protocol_version < CLIENT_ID_PROTOCOL_VERSION:
            return await self.view.draw_client_id()  # a server older than AllocateClientId
        q = ReqId(-1, 0, 0, next(self._seqs))
        answer = await link.ask(conn, AllocateClientIdRequest(q), self.config.request_timeout)
        if isinstance(answer, ClientIdAllocated):
            return answer.client_id
        if isinstance(answer, ErrorResponse):
            text = f"allocating a client ID: {answer.code.name}: {answer.message}"
            if answer.code in (ErrorCode.LIMIT_EXCEEDED, ErrorCode.UNAUTHORIZED):
                raise Unauthorized(text)
            raise WaltzError(text)
        raise WaltzError(f"allocating a client ID: unexpected {type(answer).__name__}")

    def _stream_closed(self, link: ServerLink, conn: ServerConnection) -> None:
        for state in self._partitions.values():
            if state.link is link:
                state.remount.set()
                if state.mount_answer is not None and not state.mount_answer.done():
                    state.core.mount_abandoned()
                    state.mount_answer.set_exception(ConnectionError(conn.closed_reason or ""))

    # --- the stream: everything in order through each partition's inbox ---------------

    def _on_stream_message(self, m: ClientMessage) -> None:
        state = self._partitions.get(m.req_id.partition_id)
        if state is None:
            return
        if (
            type(m) is FeedRows
            and state.inbox_waiting
            and state.inbox.empty()
            and not state.core.applies
        ):
            # Only watched for our own appends, and nothing before it waits: taken now,
            # not through the inbox's task (most feed a producer gets goes this way).
            try:
                self._watch_feed(state, m)
            except Exception:  # as the inbox's loop would: say so, mount again
                log.exception("partition %d: handling FeedData failed", state.partition_id)
                state.remount.set()
            return
        state.inbox.put_nowait(m)
        link = state.link
        if state.inbox.qsize() >= MAX_INBOX and link is not None and link.stream is not None:
            # The application applies slower than the feed arrives: stop reading this
            # server's stream until the inbox drains (its feeds then wait for us).
            link.stream.pause_reading()
            state.paused = link.stream

    async def _inbox_loop(self, state: _Partition) -> None:
        while True:
            state.inbox_waiting = True
            try:
                m = await state.inbox.get()
            finally:
                state.inbox_waiting = False
            if state.paused is not None and state.inbox.qsize() <= MAX_INBOX // 2:
                state.paused.resume_reading()
                state.paused = None
            try:
                await self._handle(state, m)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception(
                    "partition %d: handling %s failed", state.partition_id, type(m).__name__
                )
                state.remount.set()

    async def _handle(self, state: _Partition, m: ClientMessage) -> None:
        if isinstance(m, FeedRows):
            if state.core.is_current_feed(m.req_id):
                await self._deliver(state, m)
            return
        self._carry_out(state, state.core.receive(m))

    def _carry_out(self, state: _Partition, reaction: Reaction[_Submission]) -> None:
        """What the partition's core decided about a stream message."""
        self._resolve(reaction.settled)
        if reaction.note:
            log.info("partition %d: %s", state.partition_id, reaction.note)
        if reaction.remount:
            state.remount.set()
        answer = state.mount_answer
        if answer is not None and not answer.done():
            if reaction.mount_status is not None:
                answer.set_result(reaction.mount_status)
            elif reaction.mount_error is not None:
                answer.set_exception(reaction.mount_error)
        if reaction.flush is not None:
            flushed = state.flush_answers.pop(reaction.flush, None)
            if flushed is not None and not flushed.done():
                if reaction.flush_error is not None:
                    flushed.set_exception(reaction.flush_error)
                else:
                    flushed.set_result(reaction.flush_high_water_mark)

    def _watch_feed(self, state: _Partition, m: FeedRows) -> None:
        """A feed on a partition not applied by the application: it only settles our own
        appends, without awaiting anything."""
        core = state.core
        before = core.applied
        try:
            taken = core.take_feed(m.req_id, m.rows, self.client_id)
            self._resolve(taken.settled)
            if taken.gap is not None:
                self._feed_gap(state, taken.gap)
        finally:
            if core.applied != before:
                state.applied_changed.set()

    def _feed_gap(self, state: _Partition, txid: int) -> None:
        """``txid`` is not the next transaction: the feed has a gap; mount again."""
        log.error(
            "partition %d: feed gap: %d after %d; mounting again",
            state.partition_id,
            txid,
            state.core.applied,
        )
        state.remount.set()

    async def _deliver(self, state: _Partition, m: FeedRows) -> None:
        callbacks = self.callbacks
        core = state.core
        if not core.applies or callbacks is None:
            self._watch_feed(state, m)
            return
        for txid, client_id, generation, partition_id, seq, header in m.rows:
            row = core.row(txid)
            if row is Row.SEEN:
                continue  # delivered before this mount's starting point
            if row is Row.GAP:
                core.feed_stopped(m.req_id)
                self._feed_gap(state, txid)
                return
            q = ReqId(client_id, generation, partition_id, seq)
            resolutions = core.commit_seen(q, txid)
            txn = self._transaction(core.partition_id, txid, header, q)
            try:
                await self._call(callbacks.apply_transaction, txn)
            except Exception as e:
                try:
                    await self._call(callbacks.uncaught_exception, core.partition_id, txid, e)
                except Exception:
                    log.exception("uncaught_exception itself raised")
                # Deliver it again: mount anew from the application's high-water mark
                # (unless a newer mount is already under way), ignoring the rest of
                # this mount's feed meanwhile.
                self._resolve(resolutions)
                if core.feed_stopped(m.req_id):
                    state.remount.set()
                await asyncio.sleep(self.config.retry_backoff)
                return
            core.delivered(txid)
            state.applied_changed.set()
            self._resolve(resolutions)

    def _transaction(self, p: int, txid: int, header: int, req_id: ReqId) -> Transaction:
        loop = self._loop
        assert loop is not None

        def blocking() -> bytes:
            future = asyncio.run_coroutine_threadsafe(self.transaction_data(p, txid), loop)
            return future.result()

        return Transaction(
            txid, p, header, req_id, lambda: self.transaction_data(p, txid), blocking
        )

    def _resolve(self, resolutions: list[Resolution[_Submission]]) -> None:
        for r in resolutions:
            attempt = r.item.attempt
            if attempt is not None and not attempt.done():
                attempt.set_result(r)

    # --- submitting ---------------------------------------------------------------------

    async def submit(self, context: TransactionContext) -> SubmitResult:
        """Execute the context and append it, again on failure, until it commits, gives up
        or runs out of retries. The result says which."""
        if self._closed:
            raise WaltzError("the client is closed")
        p = context.partition_id(self.num_partitions)
        if not isinstance(p, int) or not 0 <= p < self.num_partitions:
            raise ValueError(
                f"partition_id() returned {p!r}; the cluster has {self.num_partitions} partitions"
            )
        own = context.max_retries
        if own is not None and (not isinstance(own, int) or isinstance(own, bool) or own < 1):
            raise ValueError(f"{type(context).__name__}.max_retries must be None or >= 1")
        state = self._partition(p, apply=False)
        retries = SubmissionRetries.for_context(
            own, self.config.max_retries, self.config.retry_backoff
        )
        sub = _Submission(context, p, asyncio.get_running_loop().create_future(), retries)
        self._submissions.add(sub)
        try:
            await self._run(sub, state)
        except asyncio.CancelledError:
            self._finish(sub, retries.failed("cancelled"))
            raise
        return sub.result.result()

    def _finish(self, sub: _Submission, result: SubmitResult) -> None:
        self._submissions.discard(sub)
        if not sub.result.done():
            sub.result.set_result(result)
            _hook(sub.context, "on_completion", result.committed)

    async def _run(self, sub: _Submission, state: _Partition) -> None:
        retries = sub.retries
        while retries.may_attempt(self._closed):
            retries.begin_attempt()
            await state.window.acquire()
            try:
                step = retries.after(await self._attempt(sub, state))
            except (Forbidden, MissingTransactions) as e:  # the mount is refused
                step = retries.mount_refused(e)
            except _StepFailed as e:  # the application's code raised: say whose
                step = retries.step_failed(e.step, e.error)
            finally:
                state.window.release()
            if isinstance(step, Finish):
                if step.error is not None:
                    _hook(sub.context, "on_exception", step.error)
                self._finish(sub, step.result)
                return
            if isinstance(step, RetryWhenApplied):
                _hook(sub.context, "on_lock_failure", step.transaction_id)
                await self._applied_at_least(state, step.transaction_id)
            else:
                await asyncio.sleep(step.pause)
        self._finish(sub, retries.gave_up())

    async def _applied_at_least(self, state: _Partition, txid: int) -> None:
        """Until the lock's transaction is applied, or request_timeout (it may never
        commit: locks are taken when an ID is assigned): then retry anyway."""
        deadline = asyncio.get_running_loop().time() + self.config.request_timeout
        while (
            state.core.applied < txid
            and not self._closed
            and asyncio.get_running_loop().time() < deadline
        ):
            state.applied_changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(state.applied_changed.wait(), 1.0)

    async def _mounted(self, state: _Partition) -> None:
        """Until the partition is mounted; Forbidden if the access policy refuses it."""
        while not state.ready.is_set():
            if state.core.refusal is not None:
                raise state.core.refusal
            ready = asyncio.ensure_future(state.ready.wait())
            refused = asyncio.ensure_future(state.refused.wait())
            try:
                await asyncio.wait({ready, refused}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                ready.cancel()
                refused.cancel()

    async def _attempt(self, sub: _Submission, state: _Partition) -> Resolution | None:
        """One execution and append; None when execute() gives up."""
        core = state.core
        # Every append runs this: the common case (mounted, no callbacks to ask, a plain
        # execute()) awaits nothing until the answer.
        while True:
            if not state.ready.is_set():
                await self._mounted(state)
            if self._closed:
                return Resolution(sub, Outcome.LOST)
            if not core.applies and core.has_start_mark():
                hwm = core.applied
            else:
                try:
                    hwm = await self._client_high_water_mark(state)
                except Exception as e:
                    owner = type(self.callbacks).__name__ if self.callbacks else "WaltzClient"
                    raise _StepFailed(f"{owner}.client_high_water_mark", e) from e
            builder = TransactionBuilder(core.partition_id, hwm)
            try:
                decision = sub.context.execute(builder)
                if decision is not True and inspect.isawaitable(decision):  # async execute()
                    decision = await decision
            except Exception as e:
                raise _StepFailed(f"{type(sub.context).__name__}.execute", e) from e
            if not decision:
                return None
            problem = size_problem(builder)
            if problem:
                raise _StepFailed("the transaction's size check", ValueError(problem))
            link = state.link
            if state.ready.is_set() and link is not None and link.stream is not None:
                break  # else a remount began while executing: run it again
        q = ReqId(self.client_id, core.generation, core.partition_id, next(self._seqs))
        loop = asyncio.get_running_loop()
        sub.attempt = attempt = loop.create_future()
        core.monitor.sent(q, sub)
        with contextlib.suppress(ConnectionError):  # a lost append: the next mount settles it
            link.stream.send(append_request(q, builder))
        sub.sent_at = loop.time()
        return await attempt  # the partition's watchdog flushes if it takes too long

    # --- flush, high-water marks, data, ranges -----------------------------------------

    async def _flush_partition(self, state: _Partition) -> int | None:
        link = state.link
        if link is None or link.stream is None or not state.ready.is_set():
            return None
        core = state.core
        q = ReqId(self.client_id, core.generation, core.partition_id, next(self._seqs))
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        state.flush_answers[q] = future
        core.flush_sent(q)
        try:
            link.stream.send(FlushRequest(q))
            return await asyncio.wait_for(future, self.config.request_timeout)
        except (ConnectionError, TimeoutError, WaltzError):
            core.flush_abandoned(q)
            state.flush_answers.pop(q, None)
            return None

    async def flush(self) -> None:
        """Wait until every submission made so far has its result."""
        await asyncio.sleep(0)  # submit() calls already scheduled get to register first
        pending = [s.result for s in self._submissions]
        busy = [s for s in self._partitions.values() if len(s.core.monitor)]
        await asyncio.gather(*(self._flush_partition(s) for s in busy))
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    async def high_water_mark(self, partition_id: int) -> int:
        return await self._rpc.high_water_mark(partition_id)

    async def transaction_data(self, partition_id: int, transaction_id: int) -> bytes:
        return await self._rpc.transaction_data(partition_id, transaction_id)

    def read(
        self,
        partition_id: int,
        start: int = 0,
        stop: int | None = None,
        *,
        batch_records: int = 1000,
        batch_bytes: int = 4 * 1024 * 1024,
    ) -> AsyncGenerator[Record, None]:
        """Committed records ``start..stop`` (inclusive; None: up to the high-water mark
        when the read reaches it), with their data, in order."""
        return self._rpc.read(
            partition_id, start, stop, batch_records=batch_records, batch_bytes=batch_bytes
        )

    def read_batches(
        self,
        partition_id: int,
        start: int = 0,
        stop: int | None = None,
        *,
        batch_records: int = 1000,
        batch_bytes: int = 4 * 1024 * 1024,
        in_flight: int = 1,
        checked: bool = True,
    ) -> AsyncGenerator[RecordBatch | UncheckedRecords, None]:
        """``read``, a response at a time: record batches as the server sent them (bulk
        readers such as the Spark source decode them without one object per record). A
        gap below ``start`` or between batches raises: the log has no holes. With a
        ``stop`` and ``in_flight`` > 1, that many requests for consecutive ranges are
        under way at once, so the storage node, the server and this client work on
        different batches at the same time. ``checked=False`` yields ``UncheckedRecords``
        whose first ID is the one asked for: the caller must check them
        (``UncheckedRecords.check``, or as the Spark source converts them)."""
        return self._rpc.read_batches(
            partition_id,
            start,
            stop,
            batch_records=batch_records,
            batch_bytes=batch_bytes,
            in_flight=in_flight,
            checked=checked,
        )


def _hook(context: TransactionContext, name: str, *args: Any) -> None:
    """Call an application's notification hook; its failure is logged, never raised (the
    submission's result stands)."""
    try:
        getattr(context, name)(*args)
    except Exception:
        log.exception("%s.%s raised", type(context).__name__, name)
