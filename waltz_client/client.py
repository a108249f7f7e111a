"""WaltzClient: submit transaction contexts, apply the committed feed, read ranges.

One asyncio client per process (a blocking facade wraps it for threaded
code). Per server it keeps a stream connection (mounts, appends, feed, flush)
and an RPC connection (transaction data, high-water marks, range reads).
Per partition a mount task follows the owner through ZooKeeper and runs the
spec's reconnect procedure (block appends, mount at the client high-water
mark, fail every pending append at the mount answer, unblock), and a feed
task handles everything the stream brings in order: feed data (applied in
commit order, never skipping, never repeating), mount and flush answers and
lock failures, which the transaction monitor turns into outcomes. A failed
attempt is executed again against a newer high-water mark. The client's ID comes
from the first server it mounts at (AllocateClientId), once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import inspect
import itertools
import logging
import re
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from .callbacks import WaltzClientCallbacks
from .cluster_view import ClusterView
from .config import WaltzClientConfig
from .monitor import Outcome, Resolution, TransactionMonitor
from .runtime.tasks import spawn
from .runtime.tls import TlsContexts, tls_open_connection
from .transaction import Transaction, TransactionBuilder, TransactionContext
from .wire.client_messages import (
    CLIENT_ID_PROTOCOL_VERSION,
    MAX_LOCKS,
    AllocateClientIdRequest,
    AppendRequest,
    ClientIdAllocated,
    ClientMessage,
    ErrorCode,
    ErrorResponse,
    FeedRows,
    FeedSuspended,
    FlushRequest,
    FlushResponse,
    HighWaterMarkRequest,
    HighWaterMarkResponse,
    LockFailure,
    MountRequest,
    MountResponse,
    MountStatus,
    ReadRangeRequest,
    ReadRangeResponse,
    TransactionDataRequest,
    TransactionDataResponse,
)
from .wire.errors import MalformedMessage
from .wire.framing import OpenConnection
from .wire.records import DEFAULT_MAX_DATA_BYTES, Record, RecordBatch, ReqId, UncheckedRecords
from .wire.server_connection import ServerConnection

log = logging.getLogger(__name__)

# Stream messages queued for one partition before its server's stream stops being read
# (each FeedData carries up to a few thousand headers).
MAX_INBOX = 64


def _too_big(builder: TransactionBuilder) -> str:
    """Why the server would refuse this append outright (it closes the connection)."""
    if len(builder.data) > DEFAULT_MAX_DATA_BYTES:
        return f"transaction data of {len(builder.data)} bytes exceeds {DEFAULT_MAX_DATA_BYTES}"
    for kind, locks in (
        ("write_locks", builder.write_locks),
        ("read_locks", builder.read_locks),
        ("append_locks", builder.append_locks),
    ):
        if len(locks) > MAX_LOCKS:
            return f"{len(locks)} {kind} exceed {MAX_LOCKS}"
    return ""


def _hashes(locks: list) -> tuple[int, ...]:
    return tuple(lock.hash32() for lock in locks) if locks else ()


class SubmitStatus(Enum):
    COMMITTED = "committed"
    IGNORED = "ignored"  # execute() returned False
    FAILED = "failed"  # gave up: retries exhausted, execute() raised, or the client closed


@dataclass(frozen=True)
class SubmitResult:
    status: SubmitStatus
    transaction_id: int = -1
    attempts: int = 0
    reason: str = ""

    @property
    def committed(self) -> bool:
        return self.status == SubmitStatus.COMMITTED


class WaltzError(Exception):
    """A request the cluster could not answer in time, or a client that is closed."""


class Forbidden(WaltzError):
    """The cluster's access policy does not let this client's certificate identity do
    that on the partition (the server's FORBIDDEN)."""


class Unauthorized(Forbidden):
    """This client's certificate identity may not have a client ID (its quota is used up:
    LIMIT_EXCEEDED), or may not act as the one it has (UNAUTHORIZED: it was released
    after going unused for the server's client_id_retention)."""


class MissingTransactions(WaltzError):
    """A range read found its first transactions gone (below the partition's retention
    mark): ``first_available`` is where the log now starts."""

    def __init__(self, partition_id: int, requested: int, first_available: int) -> None:
        super().__init__(
            f"partition {partition_id}: transactions {requested}..{first_available - 1} are "
            f"no longer in the log; the first available is {first_available}"
        )
        self.partition_id = partition_id
        self.requested = requested
        self.first_available = first_available


_FIRST_AVAILABLE = re.compile(r"first available is (\d+)")


def truncated(partition_id: int, requested: int, answer: ErrorResponse) -> MissingTransactions:
    """The server's TRUNCATED answer as an exception (its message names the log start)."""
    m = _FIRST_AVAILABLE.search(answer.message)
    return MissingTransactions(partition_id, requested, int(m.group(1)) if m else requested + 1)


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
    attempts: int = 0
    attempt: asyncio.Future[Resolution] | None = None
    sent_at: float = 0.0


@dataclass(eq=False)
class _Partition:
    partition_id: int
    apply: bool  # hand the feed to the application (else only watch it for our appends)
    window: asyncio.Semaphore
    generation: int = -1
    link: _ServerLink | None = None
    mount_req: ReqId | None = None
    broken_mount: ReqId | None = None  # its feed stopped at an application failure
    paused: ServerConnection | None = None  # the stream we stopped reading for this inbox
    applied: int = -1  # the last transaction ID delivered (and applied, when applying)
    ready: asyncio.Event = field(default_factory=asyncio.Event)  # appends may go out
    remount: asyncio.Event = field(default_factory=asyncio.Event)
    applied_changed: asyncio.Event = field(default_factory=asyncio.Event)
    inbox: asyncio.Queue = field(default_factory=asyncio.Queue)  # stream messages, in order
    inbox_waiting: bool = False  # its loop waits for the next message, none in hand
    monitor: TransactionMonitor[_Submission] = field(default_factory=TransactionMonitor)
    mount_answer: asyncio.Future | None = None
    # Why the partition's last mount was refused (FORBIDDEN, TRUNCATED); set until a
    # mount succeeds.
    refusal_error: WaltzError | None = None
    refusal: str | None = None
    refused: asyncio.Event = field(default_factory=asyncio.Event)
    # Flush ReqId -> (appends pending when it was sent, the mount it was sent under, answer)
    flushes: dict[ReqId, tuple[set[ReqId], ReqId | None, asyncio.Future]] = field(
        default_factory=dict
    )
    tasks: list[asyncio.Task] = field(default_factory=list)


class _ServerLink:
    """The stream and RPC connections to one server."""

    def __init__(self, client: WaltzClient, endpoint: str) -> None:
        self.client = client
        self.endpoint = endpoint
        self.stream: ServerConnection | None = None
        self.rpc: ServerConnection | None = None
        self.stream_seq = 0
        self.rpc_waiters: dict[ReqId, asyncio.Future] = {}
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()  # the connections' watchers

    async def stream_connection(self) -> ServerConnection:
        async with self._lock:
            if self.stream is None or self.stream.closed:
                host, _, port = self.endpoint.rpartition(":")
                self.stream = await ServerConnection.connect(
                    host,
                    int(port),
                    on_message=self.client._on_stream_message,
                    open_connection=self.client._dialer(self.endpoint),
                    feed_rows=True,  # _watch_feed and _deliver read rows
                )
                self.stream_seq = self.client._next_connection_seq()
                conn = self.stream
                spawn(self._watch_stream(conn), self._tasks, "watching a stream connection", log)
            return self.stream

    async def _watch_stream(self, conn: ServerConnection) -> None:
        await conn.closed_event.wait()
        self.client._stream_closed(self, conn)

    async def rpc_connection(self) -> ServerConnection:
        async with self._lock:
            if self.rpc is None or self.rpc.closed:
                host, _, port = self.endpoint.rpartition(":")
                self.rpc = await ServerConnection.connect(
                    host,
                    int(port),
                    on_message=self._on_rpc_message,
                    open_connection=self.client._dialer(self.endpoint),
                    check_records=False,  # _read_range checks them, or its caller does
                )
                conn = self.rpc
                spawn(self._watch_rpc(conn), self._tasks, "watching an RPC connection", log)
            return self.rpc

    async def _watch_rpc(self, conn: ServerConnection) -> None:
        """A closed RPC connection fails its waiting requests at once (they retry)."""
        await conn.closed_event.wait()
        waiters, self.rpc_waiters = self.rpc_waiters, {}
        for future in waiters.values():
            if not future.done():
                future.set_exception(ConnectionError(conn.closed_reason or "closed"))

    def _on_rpc_message(self, m: ClientMessage) -> None:
        future = self.rpc_waiters.pop(m.req_id, None)
        if future is not None and not future.done():
            future.set_result(m)

    async def close(self) -> None:
        for conn in (self.stream, self.rpc):
            if conn is not None:
                await conn.close()


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
        self._links: dict[str, _ServerLink] = {}
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
            self._finish(
                sub,
                SubmitResult(
                    SubmitStatus.FAILED, attempts=sub.attempts, reason="the client closed"
                ),
            )
        for state in self._partitions.values():
            state.ready.set()  # submissions waiting for a mount wake and see the close
            for sub in state.monitor.items():
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
        return state.applied if state is not None else -1

    # --- callbacks, on the loop or on a worker thread -----------------------------------

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        if inspect.iscoroutinefunction(fn):
            return await fn(*args)
        assert self._loop is not None
        return await self._loop.run_in_executor(self._executor, fn, *args)

    async def _client_high_water_mark(self, state: _Partition) -> int:
        if not state.apply or self.callbacks is None:
            if state.mount_req is None and state.applied == -1:
                # Watching only for our own appends: start at the end of the log.
                state.applied = await self.high_water_mark(state.partition_id)
            return state.applied
        hwm = await self._call(self.callbacks.client_high_water_mark, state.partition_id)
        if not isinstance(hwm, int) or hwm < -1:
            raise WaltzError(f"client_high_water_mark({state.partition_id}) returned {hwm!r}")
        return hwm

    # --- partitions: mounting -----------------------------------------------------------

    def _partition(self, partition_id: int, apply: bool) -> _Partition:
        state = self._partitions.get(partition_id)
        if state is None:
            state = _Partition(
                partition_id, apply, asyncio.Semaphore(self.config.max_outstanding_appends)
            )
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
            oldest = min((s.sent_at for s in state.monitor.items()), default=None)
            if oldest is not None and loop.time() - oldest > self.config.request_timeout:
                await self._flush_partition(state)

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

    def _link(self, endpoint: str) -> _ServerLink:
        link = self._links.get(endpoint)
        if link is None:
            link = self._links[endpoint] = _ServerLink(self, endpoint)
        return link

    async def _mount_loop(self, state: _Partition) -> None:
        p = state.partition_id
        backoff = self.config.retry_backoff
        while not self._closed:
            state.ready.clear()  # the reconnect procedure: appends wait
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
                state.generation, state.link = generation, link
                state.applied = hwm
                q = ReqId(self.client_id, generation, p, next(self._seqs))
                state.mount_req = q
                state.mount_answer = asyncio.get_running_loop().create_future()
                state.remount.clear()
                conn.send(MountRequest(q, hwm, link.stream_seq))
                status = await asyncio.wait_for(state.mount_answer, self.config.mount_timeout)
            except (Forbidden, MissingTransactions) as e:
                if isinstance(e, MissingTransactions) and not state.apply:
                    # Only watching for our own appends (recent ones): go on from the start.
                    state.applied = max(state.applied, e.first_available - 1)
                    continue
                # The policy may change, the application may restore from a snapshot: try
                # again, a little later; meanwhile appends fail with the reason.
                if state.refusal != str(e):
                    if isinstance(e, MissingTransactions):
                        log.error(
                            "partition %d: cannot mount: the application's high-water mark "
                            "is below the log start: %s",
                            p,
                            e,
                        )
                    else:
                        log.warning("partition %d: %s", p, e)
                state.refusal = str(e)
                state.refusal_error = e
                state.refused.set()
                await asyncio.sleep(max(backoff, 1.0))
                backoff = min(2.0, backoff * 2)
                continue
            except Exception as e:  # refused, timed out, a callback failing: retry it all
                log.info("partition %d: mounting at %s failed: %s", p, owner[0], e)
                await asyncio.sleep(backoff)
                backoff = min(2.0, backoff * 2)
                continue
            if status == MountStatus.READY:
                backoff = self.config.retry_backoff
                state.refusal = None
                state.refusal_error = None
                state.refused.clear()
                state.ready.set()
                await state.remount.wait()
                continue
            log.info("partition %d: mount at %s answered %s", p, endpoint, status.name)
            if status == MountStatus.STALE_CONNECTION and link.stream is not None:
                await link.stream.close()
            await self.view.changed(min(1.0, backoff))
            backoff = min(2.0, backoff * 2)

    async def _ensure_client_id(self, link: _ServerLink) -> None:
        """Before the first Mount: get this client's ID from the server at ``link``."""
        if self.view.client_id >= 0:
            return
        async with self._client_id_lock:
            if self.view.client_id < 0:
                self.view.client_id = await self._allocate_client_id(link)
                log.info("client ID %d (from %s)", self.view.client_id, link.endpoint)

    async def _allocate_client_id(self, link: _ServerLink) -> int:
        conn = await link.rpc_connection()
        if conn.protocol_version < CLIENT_ID_PROTOCOL_VERSION:
            return await self.view.draw_client_id()  # a server older than AllocateClientId
        q = ReqId(-1, 0, 0, next(self._seqs))
        future = asyncio.get_running_loop().create_future()
        link.rpc_waiters[q] = future
        try:
            conn.send(AllocateClientIdRequest(q))
            answer = await asyncio.wait_for(future, self.config.request_timeout)
        finally:
            link.rpc_waiters.pop(q, None)
        if isinstance(answer, ClientIdAllocated):
            return answer.client_id
        if isinstance(answer, ErrorResponse):
            text = f"allocating a client ID: {answer.code.name}: {answer.message}"
            if answer.code in (ErrorCode.LIMIT_EXCEEDED, ErrorCode.UNAUTHORIZED):
                raise Unauthorized(text)
            raise WaltzError(text)
        raise WaltzError(f"allocating a client ID: unexpected {type(answer).__name__}")

    def _stream_closed(self, link: _ServerLink, conn: ServerConnection) -> None:
        for state in self._partitions.values():
            if state.link is link:
                state.remount.set()
                if state.mount_answer is not None and not state.mount_answer.done():
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
            and not (state.apply and self.callbacks is not None)
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
        match m:
            case FeedRows(req_id=q) if q == state.mount_req and q != state.broken_mount:
                await self._deliver(state, m)
            case MountResponse(req_id=q, status=status) if q == state.mount_req:
                if status == MountStatus.READY:
                    # Every append sent before the mount is settled: pending ones are lost.
                    self._resolve(state, state.monitor.mounted())
                if state.mount_answer is not None and not state.mount_answer.done():
                    state.mount_answer.set_result(status)
            case LockFailure(req_id=q, transaction_id=txid):
                resolution = state.monitor.lock_failed(q, txid)
                if resolution is not None:
                    self._resolve(state, [resolution])
            case FlushResponse(req_id=q) if q in state.flushes:
                sent_before, mount, future = state.flushes.pop(q)
                # Only the mount it was sent under can say which appends are lost: after a
                # remount, the new mount's answer settles them instead.
                if mount == state.mount_req:
                    self._resolve(state, state.monitor.flushed(sent_before))
                if not future.done():
                    future.set_result(m.transaction_id)
            case FeedSuspended(req_id=q) if q == state.mount_req:
                log.info("partition %d: feed suspended: %s", state.partition_id, m.reason)
                state.remount.set()
            case ErrorResponse(req_id=q) if q == state.mount_req:
                if state.mount_answer is not None and state.mount_answer.done():
                    # The feed of a settled mount ended (its next transaction went with
                    # retention): mount again, which says why.
                    log.info("partition %d: feed ended: %s", state.partition_id, m.message)
                    state.remount.set()
                elif state.mount_answer is not None:
                    if m.code == ErrorCode.TRUNCATED:
                        error = truncated(state.partition_id, state.applied + 1, m)
                    else:
                        kind = {
                            ErrorCode.FORBIDDEN: Forbidden,
                            ErrorCode.UNAUTHORIZED: Unauthorized,
                        }.get(m.code, WaltzError)
                        error = kind(f"mount: {m.code.name}: {m.message}")
                    state.mount_answer.set_exception(error)
            case ErrorResponse(req_id=q) if q in state.monitor:
                refused = state.monitor.refused(q, f"{m.code.name}: {m.message}")
                if refused is not None:
                    self._resolve(state, [refused])
            case ErrorResponse(req_id=q) if q in state.flushes:
                _, mount, future = state.flushes.pop(q)
                if m.code == ErrorCode.NOT_MOUNTED and mount == state.mount_req:
                    state.remount.set()  # the server rebuilt the partition: mount anew
                if not future.done():
                    future.set_exception(WaltzError(f"flush: {m.code.name}: {m.message}"))

    def _watch_feed(self, state: _Partition, m: FeedRows) -> None:
        """``_handle`` of a feed on a partition not applied by the application: it only
        settles our own appends, without awaiting anything."""
        if m.req_id != state.mount_req or m.req_id == state.broken_mount:
            return  # an older mount's feed
        before = state.applied
        own = self.client_id  # every ReqId this client sends carries it
        try:
            for txid, client_id, generation, partition_id, seq, _ in m.rows:
                if txid <= state.applied:
                    continue
                if not self._in_order(state, txid):
                    return
                state.applied = txid
                if client_id == own and state.monitor:
                    q = ReqId(client_id, generation, partition_id, seq)
                    resolutions = state.monitor.committed(q, txid)
                    if resolutions:
                        self._resolve(state, resolutions)
        finally:
            if state.applied != before:
                state.applied_changed.set()

    def _in_order(self, state: _Partition, txid: int) -> bool:
        """Whether ``txid`` is the next transaction; if not, the feed has a gap: mount
        again."""
        if txid == state.applied + 1:
            return True
        log.error(
            "partition %d: feed gap: %d after %d; mounting again",
            state.partition_id,
            txid,
            state.applied,
        )
        state.remount.set()
        return False

    async def _deliver(self, state: _Partition, m: FeedRows) -> None:
        callbacks = self.callbacks
        if not state.apply or callbacks is None:
            self._watch_feed(state, m)
            return
        for txid, client_id, generation, partition_id, seq, header in m.rows:
            if txid <= state.applied:
                continue  # delivered before this mount's starting point
            if not self._in_order(state, txid):
                return
            q = ReqId(client_id, generation, partition_id, seq)
            resolutions = state.monitor.committed(q, txid)
            txn = self._transaction(state.partition_id, txid, header, q)
            try:
                await self._call(callbacks.apply_transaction, txn)
            except Exception as e:
                try:
                    await self._call(callbacks.uncaught_exception, state.partition_id, txid, e)
                except Exception:
                    log.exception("uncaught_exception itself raised")
                # Deliver it again: mount anew from the application's high-water mark
                # (unless a newer mount is already under way), ignoring the rest of
                # this mount's feed meanwhile.
                self._resolve(state, resolutions)
                if state.mount_req == m.req_id:
                    state.broken_mount = m.req_id
                    state.remount.set()
                await asyncio.sleep(self.config.retry_backoff)
                return
            state.applied = txid
            state.applied_changed.set()
            self._resolve(state, resolutions)

    def _transaction(self, p: int, txid: int, header: int, req_id: ReqId) -> Transaction:
        loop = self._loop
        assert loop is not None

        def blocking() -> bytes:
            future = asyncio.run_coroutine_threadsafe(self.transaction_data(p, txid), loop)
            return future.result()

        return Transaction(
            txid, p, header, req_id, lambda: self.transaction_data(p, txid), blocking
        )

    def _resolve(self, state: _Partition, resolutions: list[Resolution[_Submission]]) -> None:
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
        sub = _Submission(context, p, asyncio.get_running_loop().create_future())
        self._submissions.add(sub)
        try:
            await self._run(sub, state)
        except asyncio.CancelledError:
            self._finish(
                sub, SubmitResult(SubmitStatus.FAILED, attempts=sub.attempts, reason="cancelled")
            )
            raise
        return sub.result.result()

    def _finish(self, sub: _Submission, result: SubmitResult) -> None:
        self._submissions.discard(sub)
        if not sub.result.done():
            sub.result.set_result(result)
            _hook(sub.context, "on_completion", result.committed)

    async def _run(self, sub: _Submission, state: _Partition) -> None:
        limit = sub.context.max_retries
        if limit is None:
            limit = self.config.max_retries
        backoff = self.config.retry_backoff
        reason = ""
        while sub.attempts < limit and not self._closed:
            sub.attempts += 1
            await state.window.acquire()
            try:
                outcome = await self._attempt(sub, state)
            except Forbidden as e:
                self._finish(
                    sub, SubmitResult(SubmitStatus.FAILED, attempts=sub.attempts, reason=str(e))
                )
                return
            except MissingTransactions as e:  # the mount is refused: below the log start
                _hook(sub.context, "on_exception", e)
                self._finish(
                    sub,
                    SubmitResult(
                        SubmitStatus.FAILED, attempts=sub.attempts, reason=f"mount refused: {e!r}"
                    ),
                )
                return
            except _StepFailed as e:  # the application's code raised: say whose
                _hook(sub.context, "on_exception", e.error)
                self._finish(
                    sub,
                    SubmitResult(
                        SubmitStatus.FAILED,
                        attempts=sub.attempts,
                        reason=f"{e.step} raised {e.error!r}",
                    ),
                )
                return
            finally:
                state.window.release()
            if outcome is None:
                self._finish(sub, SubmitResult(SubmitStatus.IGNORED, attempts=sub.attempts))
                return
            if outcome.outcome == Outcome.COMMITTED:
                self._finish(
                    sub, SubmitResult(SubmitStatus.COMMITTED, outcome.transaction_id, sub.attempts)
                )
                return
            if outcome.outcome == Outcome.REFUSED:
                self._finish(
                    sub,
                    SubmitResult(
                        SubmitStatus.FAILED,
                        attempts=sub.attempts,
                        reason=f"the server refused it: {outcome.reason}",
                    ),
                )
                return
            if outcome.outcome == Outcome.LOCK_FAILED:
                reason = f"lock failure against transaction {outcome.transaction_id}"
                _hook(sub.context, "on_lock_failure", outcome.transaction_id)
                await self._applied_at_least(state, outcome.transaction_id)
            else:
                reason = "the append was lost (server or connection failure)"
                await asyncio.sleep(backoff)
                backoff = min(2.0, backoff * 2)
        self._finish(
            sub,
            SubmitResult(
                SubmitStatus.FAILED,
                attempts=sub.attempts,
                reason=f"gave up after {sub.attempts} attempts: {reason}",
            ),
        )

    async def _applied_at_least(self, state: _Partition, txid: int) -> None:
        """Until the lock's transaction is applied, or request_timeout (it may never
        commit: locks are taken when an ID is assigned): then retry anyway."""
        deadline = asyncio.get_running_loop().time() + self.config.request_timeout
        while (
            state.applied < txid
            and not self._closed
            and asyncio.get_running_loop().time() < deadline
        ):
            state.applied_changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(state.applied_changed.wait(), 1.0)

    async def _mounted(self, state: _Partition) -> None:
        """Until the partition is mounted; Forbidden if the access policy refuses it."""
        while not state.ready.is_set():
            if state.refusal is not None:
                raise state.refusal_error or Forbidden(state.refusal)
            ready = asyncio.ensure_future(state.ready.wait())
            refused = asyncio.ensure_future(state.refused.wait())
            try:
                await asyncio.wait({ready, refused}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                ready.cancel()
                refused.cancel()

    async def _attempt(self, sub: _Submission, state: _Partition) -> Resolution | None:
        """One execution and append; None when execute() gives up."""
        # Every append runs this: the common case (mounted, no callbacks to ask, a plain
        # execute()) awaits nothing until the answer.
        while True:
            if not state.ready.is_set():
                await self._mounted(state)
            if self._closed:
                return Resolution(sub, Outcome.LOST)
            if (not state.apply or self.callbacks is None) and (
                state.mount_req is not None or state.applied != -1
            ):
                hwm = state.applied
            else:
                try:
                    hwm = await self._client_high_water_mark(state)
                except Exception as e:
                    owner = type(self.callbacks).__name__ if self.callbacks else "WaltzClient"
                    raise _StepFailed(f"{owner}.client_high_water_mark", e) from e
            builder = TransactionBuilder(state.partition_id, hwm)
            try:
                decision = sub.context.execute(builder)
                if decision is not True and inspect.isawaitable(decision):  # async execute()
                    decision = await decision
            except Exception as e:
                raise _StepFailed(f"{type(sub.context).__name__}.execute", e) from e
            if not decision:
                return None
            problem = _too_big(builder)
            if problem:
                raise _StepFailed("the transaction's size check", ValueError(problem))
            link = state.link
            if state.ready.is_set() and link is not None and link.stream is not None:
                break  # else a remount began while executing: run it again
        q = ReqId(self.client_id, state.generation, state.partition_id, next(self._seqs))
        loop = asyncio.get_running_loop()
        sub.attempt = attempt = loop.create_future()
        state.monitor.sent(q, sub)
        with contextlib.suppress(ConnectionError):  # a lost append: the next mount settles it
            link.stream.send(
                AppendRequest(
                    q,
                    builder.client_high_water_mark,
                    _hashes(builder.write_locks),
                    _hashes(builder.read_locks),
                    _hashes(builder.append_locks),
                    builder.header,
                    builder.data,
                )
            )
        sub.sent_at = loop.time()
        return await attempt  # the partition's watchdog flushes if it takes too long

    # --- flush, high-water marks, data, ranges -----------------------------------------

    async def _flush_partition(self, state: _Partition) -> int | None:
        link = state.link
        if link is None or link.stream is None or not state.ready.is_set():
            return None
        q = ReqId(self.client_id, state.generation, state.partition_id, next(self._seqs))
        future = asyncio.get_running_loop().create_future()
        state.flushes[q] = (state.monitor.pending_ids(), state.mount_req, future)
        try:
            link.stream.send(FlushRequest(q))
            return await asyncio.wait_for(future, self.config.request_timeout)
        except (ConnectionError, TimeoutError, WaltzError):
            state.flushes.pop(q, None)
            return None

    async def flush(self) -> None:
        """Wait until every submission made so far has its result."""
        await asyncio.sleep(0)  # submit() calls already scheduled get to register first
        pending = [s.result for s in self._submissions]
        busy = [s for s in self._partitions.values() if len(s.monitor)]
        await asyncio.gather(*(self._flush_partition(s) for s in busy))
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    async def _rpc(
        self,
        partition_id: int,
        make: Callable[[ReqId], ClientMessage],
        *,
        requested: int = 0,  # the transaction asked for (for a TRUNCATED answer)
    ):
        deadline = asyncio.get_running_loop().time() + self.config.request_timeout
        backoff = self.config.retry_backoff
        last = "no owner"
        while asyncio.get_running_loop().time() < deadline:
            if self._closed:
                raise WaltzError("the client is closed")
            owner = self.view.owner(partition_id)
            if owner is None:
                await self.view.changed(min(1.0, backoff))
                continue
            endpoint, generation = owner
            q = ReqId(self.client_id, generation, partition_id, next(self._seqs))
            link = self._link(endpoint)
            try:
                conn = await link.rpc_connection()
                future = asyncio.get_running_loop().create_future()
                link.rpc_waiters[q] = future
                conn.send(make(q))
                remaining = max(0.1, deadline - asyncio.get_running_loop().time())
                answer = await asyncio.wait_for(future, remaining)
            except (OSError, ConnectionError, TimeoutError) as e:
                link.rpc_waiters.pop(q, None)
                last = f"{endpoint}: {e or type(e).__name__}"
            else:
                if not isinstance(answer, ErrorResponse):
                    return answer
                last = f"{endpoint}: {answer.code.name}: {answer.message}"
                if answer.code not in (
                    ErrorCode.NOT_OWNER,
                    ErrorCode.NOT_READY,
                    ErrorCode.STORAGE_UNAVAILABLE,
                ):
                    if answer.code == ErrorCode.TRUNCATED:
                        raise truncated(partition_id, requested, answer)
                    raise (Forbidden if answer.code == ErrorCode.FORBIDDEN else WaltzError)(last)
            await asyncio.sleep(backoff)
            backoff = min(2.0, backoff * 2)
        raise WaltzError(f"partition {partition_id}: no answer in time ({last})")

    async def high_water_mark(self, partition_id: int) -> int:
        answer = await self._rpc(partition_id, HighWaterMarkRequest)
        assert isinstance(answer, HighWaterMarkResponse)
        return answer.transaction_id

    async def transaction_data(self, partition_id: int, transaction_id: int) -> bytes:
        answer = await self._rpc(
            partition_id,
            lambda q: TransactionDataRequest(q, transaction_id),
            requested=transaction_id,
        )
        assert isinstance(answer, TransactionDataResponse)
        if answer.data is None:
            raise LookupError(answer.error)
        return answer.data

    async def read(
        self,
        partition_id: int,
        start: int = 0,
        stop: int | None = None,
        *,
        batch_records: int = 1000,
        batch_bytes: int = 4 * 1024 * 1024,
    ) -> AsyncIterator[Record]:
        """Committed records ``start..stop`` (inclusive; None: up to the high-water mark
        when the read reaches it), with their data, in order."""
        async for batch in self.read_batches(
            partition_id, start, stop, batch_records=batch_records, batch_bytes=batch_bytes
        ):
            for record in batch.records():
                yield record

    async def read_batches(
        self,
        partition_id: int,
        start: int = 0,
        stop: int | None = None,
        *,
        batch_records: int = 1000,
        batch_bytes: int = 4 * 1024 * 1024,
        in_flight: int = 1,
        checked: bool = True,
    ) -> AsyncIterator[RecordBatch | UncheckedRecords]:
        """``read``, a response at a time: record batches as the server sent them (bulk
        readers such as the Spark source decode them without one object per record). A
        gap below ``start`` or between batches raises: the log has no holes. With a
        ``stop`` and ``in_flight`` > 1, that many requests for consecutive ranges are
        under way at once, so the storage node, the server and this client work on
        different batches at the same time. ``checked=False`` yields ``UncheckedRecords``
        whose first ID is the one asked for: the caller must check them
        (``UncheckedRecords.check``, or as the Spark source converts them)."""
        if (
            start < 0
            or batch_records < 1
            or batch_bytes < 1
            or in_flight < 1
            or (stop is not None and stop < -1)
        ):
            raise ValueError(
                f"read({partition_id}, {start}, {stop}): need start >= 0, stop >= -1 and "
                f"positive batch sizes and in_flight"
            )
        if stop is not None and in_flight > 1:
            async for batch in self._read_pipelined(
                partition_id, start, stop, batch_records, batch_bytes, in_flight, checked
            ):
                yield batch
            return
        next_txid = start
        while stop is None or next_txid <= stop:
            count = batch_records if stop is None else min(batch_records, stop - next_txid + 1)
            batch = await self._read_range(
                partition_id, next_txid, count, batch_bytes, stop, checked
            )
            if batch is None:
                return
            yield batch
            next_txid = batch.last_txid + 1

    async def _read_range(
        self,
        partition_id: int,
        first: int,
        count: int,
        batch_bytes: int,
        stop: int | None,
        checked: bool = True,
    ) -> RecordBatch | UncheckedRecords | None:
        """One range read from ``first``; None at the end of the log (no ``stop``)."""
        answer = await self._rpc(
            partition_id, lambda q: ReadRangeRequest(q, first, count, batch_bytes), requested=first
        )
        assert isinstance(answer, ReadRangeResponse)
        batch = answer.records
        if not len(batch):
            if stop is not None and stop > answer.high_water_mark:
                raise WaltzError(
                    f"partition {partition_id}: transaction {stop} is not committed "
                    f"(high-water mark {answer.high_water_mark})"
                )
            return None
        if checked and isinstance(batch, UncheckedRecords):
            batch = batch.check(DEFAULT_MAX_DATA_BYTES)
        first_txid = batch.first_txid
        if first_txid is None:  # unchecked, and not even one record's ID: a bad reply
            raise MalformedMessage(f"range read: {len(batch)} records in {len(batch.buf)} bytes")
        if first_txid != first:
            raise MissingTransactions(partition_id, first, first_txid)
        return batch

    async def _read_pipelined(
        self,
        partition_id: int,
        start: int,
        stop: int,
        batch_records: int,
        batch_bytes: int,
        in_flight: int,
        checked: bool = True,
    ) -> AsyncIterator[RecordBatch | UncheckedRecords]:
        pending: collections.deque[tuple[int, int, asyncio.Task]] = collections.deque()
        next_txid = start
        try:
            while pending or next_txid <= stop:
                while len(pending) < in_flight and next_txid <= stop:
                    count = min(batch_records, stop - next_txid + 1)
                    task = asyncio.ensure_future(
                        self._read_range(partition_id, next_txid, count, batch_bytes, stop, checked)
                    )
                    pending.append((next_txid, count, task))
                    next_txid += count
                first, count, task = pending.popleft()
                batch = await task
                if batch is None:  # stop is above the high-water mark: _read_range raised
                    return
                yield batch
                # A response cut short by batch_bytes: the rest of its range, in order.
                rest = batch.last_txid + 1
                while rest < first + count:
                    more = await self._read_range(
                        partition_id, rest, first + count - rest, batch_bytes, stop, checked
                    )
                    assert more is not None
                    yield more
                    rest = more.last_txid + 1
        finally:
            for _, _, task in pending:
                task.cancel()


def _hook(context: TransactionContext, name: str, *args: Any) -> None:
    """Call an application's notification hook; its failure is logged, never raised (the
    submission's result stands)."""
    try:
        getattr(context, name)(*args)
    except Exception:
        log.exception("%s.%s raised", type(context).__name__, name)
