"""WaltzClient: submit transaction contexts, apply the committed feed, read ranges.

One asyncio client per process (a blocking facade wraps it for threaded code). This is
the shell: it moves messages and time, and every decision about a partition (its mount,
its feed's order, what settles each append, when to mount again) is taken by the pure
``ClientPartition``; what follows each attempt of a submission, by
``SubmissionRetries``. Per server the client keeps a ``ServerLink`` (a stream connection
for mounts, appends, the feed and flushes; an RPC connection for the requests in
``rpc.py``). Per partition a ``PartitionDriver`` (``partition_driver.py``) runs the
mount loop, the inbox loop and the watchdog; the client routes each stream message to
its partition's driver. The client's ID comes from the first server it mounts at
(AllocateClientId), once.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import logging
import time
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .append import size_problem
from .callbacks import WaltzClientCallbacks
from .client_partition import ClientPartition
from .client_stats import PartitionStats
from .cluster_view import ClusterView
from .config import WaltzClientConfig
from .errors import (
    Forbidden,
    MissingTransactions,
    SubmissionFailed,
    Unauthorized,
    WaltzError,
    truncated,
)
from .monitor import Outcome, Resolution
from .partition_driver import MAX_INBOX as MAX_INBOX
from .partition_driver import DriverContext, PartitionDriver
from .rpc import PartitionRpc
from .runtime.tasks import spawn, wait_for
from .runtime.tls import TlsContexts, tls_open_connection
from .server_link import ServerLink
from .submit_policy import (
    Finish,
    RetryWhenApplied,
    SubmissionRetries,
    SubmitResult,
    SubmitStatus,
    completion_hook,
)
from .transaction import TransactionBuilder, TransactionContext
from .wire.client_messages import (
    CLIENT_ID_PROTOCOL_VERSION,
    AllocateClientIdRequest,
    ClientIdAllocated,
    ClientMessage,
    ErrorCode,
    ErrorResponse,
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


class _Expired(Exception):
    """The submission's deadline passed while it waited to make an attempt."""


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


# A partition's driver, over the submissions to it.
_Partition = PartitionDriver[_Submission]


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
            config.zookeeper,
            config.zk_root,
            config.zk_session_timeout,
            tls=config.zk_tls,
            connect_timeout=config.zk_connect_timeout,
        )
        self.view.on_grown = self._partitions_grown
        self._links: dict[str, ServerLink] = {}
        self._partitions: dict[int, _Partition] = {}
        self._background: set[asyncio.Task[Any]] = set()  # partitions_added calls
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
        self._driver_context = DriverContext(
            config,
            callbacks,
            self.view,
            self._link,
            self._ensure_client_id,
            self._next_seq,
            lambda: self._closed,
            self._call,
            self.high_water_mark,
            self.transaction_data,
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
            state.stop()
        for state in self._partitions.values():
            await state.stopped()
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

    # --- partitions ---------------------------------------------------------------------

    def _partition(self, partition_id: int, apply: bool) -> _Partition:
        state = self._partitions.get(partition_id)
        if state is None:
            core: ClientPartition[_Submission] = ClientPartition(
                partition_id, apply and self.callbacks is not None, self.config.retry_backoff
            )
            window = asyncio.Semaphore(self.config.max_outstanding_appends)
            state = _Partition(core, window, self._driver_context)
            self._partitions[partition_id] = state
            state.start()
        return state

    def _partitions_grown(self, old: int, new: int) -> None:
        """The cluster grew (on the loop, as the view takes the new count): a client that
        follows every partition mounts the new ones now, before any submission could
        reach them as a partition only written to; then the application hears of it."""
        if self._closed:
            return
        added = list(range(old, new))
        if self.config.feed and self.config.partitions is None:
            for p in added:
                self._partition(p, apply=True)
        if self.callbacks is not None:
            spawn(
                self._call(self.callbacks.partitions_added, added),
                self._background,
                f"{type(self.callbacks).__name__}.partitions_added",
                log,
            )

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
                self.config._max_protocol_version,
            )
        return link

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

    # --- the stream: each message to its partition's driver -----------------------------

    def _stream_closed(self, link: ServerLink, conn: ServerConnection) -> None:
        for state in self._partitions.values():
            state.stream_closed(link, conn)

    def _on_stream_message(self, m: ClientMessage) -> None:
        state = self._partitions.get(m.req_id.partition_id)
        if state is not None:
            state.receive(m)

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
        timeout = context.timeout
        if timeout is not None and (
            not isinstance(timeout, int | float) or isinstance(timeout, bool) or not timeout > 0
        ):
            raise ValueError(f"{type(context).__name__}.timeout must be None or > 0 seconds")
        state = self._partition(p, apply=False)
        retries = SubmissionRetries.for_context(
            own,
            self.config.max_retries,
            self.config.retry_backoff,
            asyncio.get_running_loop().time(),
            timeout,
            self.config.transaction_timeout,
        )
        sub = _Submission(context, p, asyncio.get_running_loop().create_future(), retries)
        self._submissions.add(sub)
        try:
            await self._run(sub, state)
        except asyncio.CancelledError:
            self._finish(sub, retries.failed("cancelled"))
            raise
        return sub.result.result()

    def _finish(
        self, sub: _Submission, result: SubmitResult, error: BaseException | None = None
    ) -> None:
        """The submission ends with ``result``: its caller gets it, and the context hears
        of it through exactly one hook (``completion_hook`` says which)."""
        self._submissions.discard(sub)
        if not sub.result.done():
            sub.result.set_result(result)
            hook = completion_hook(result)
            if hook == "on_completion":
                _hook(sub.context, hook, result.committed)
            elif hook == "on_exception":
                _hook(sub.context, hook, error or SubmissionFailed(result.reason))
            else:
                _hook(sub.context, hook)

    async def _run(self, sub: _Submission, state: _Partition) -> None:
        retries = sub.retries
        loop = asyncio.get_running_loop()
        while retries.may_attempt(self._closed):
            if retries.expired(loop.time()):
                self._finish(sub, retries.expiry().result)
                return
            retries.begin_attempt()
            if retries.attempts > 1:
                state.core.retries += 1
            window = state.window
            if not window.locked():
                await window.acquire()  # room now: no wait, so no timer (every append)
            else:
                try:  # waiting for room counts against the deadline
                    await wait_for(window.acquire(), retries.remaining(loop.time()))
                except TimeoutError:
                    self._finish(sub, retries.expiry().result)
                    return
            try:
                step = retries.after(await self._attempt(sub, state))
            except _Expired:
                step = retries.expiry()
            except (Forbidden, MissingTransactions) as e:  # the mount is refused
                step = retries.mount_refused(e)
            except _StepFailed as e:  # the application's code raised: say whose
                step = retries.step_failed(e.step, e.error)
            finally:
                window.release()
            if isinstance(step, Finish):
                self._finish(sub, step.result, step.error)
                return
            if isinstance(step, RetryWhenApplied):
                state.core.lock_failures += 1
                _hook(sub.context, "on_lock_failure", step.transaction_id)
                await state.applied_at_least(step.transaction_id)
            else:
                await asyncio.sleep(step.pause)
        self._finish(sub, retries.gave_up())

    async def _attempt(self, sub: _Submission, state: _Partition) -> Resolution | None:
        """One execution and append; None when execute() gives up."""
        core = state.core
        # Every append runs this: the common case (mounted, no callbacks to ask, a plain
        # execute()) awaits nothing until the answer.
        loop = asyncio.get_running_loop()
        while True:
            if not state.ready.is_set():
                try:  # waiting for a mount counts against the deadline; an append does not
                    await wait_for(state.mounted(), sub.retries.remaining(loop.time()))
                except TimeoutError:
                    raise _Expired from None
            if self._closed:
                return Resolution(sub, Outcome.LOST)
            if not core.applies and core.has_start_mark():
                hwm = core.applied
            else:
                try:
                    hwm = await state.client_high_water_mark()
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
            if state.can_send():
                break  # else a remount began while executing: run it again
        return await state.append(sub, builder)

    # --- flush, high-water marks, data, ranges -----------------------------------------

    async def flush(self) -> None:
        """Wait until every submission made so far has its result."""
        await asyncio.sleep(0)  # submit() calls already scheduled get to register first
        pending = [s.result for s in self._submissions]
        busy = [s for s in self._partitions.values() if len(s.core.monitor)]
        await asyncio.gather(*(s.flush() for s in busy))
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    async def high_water_mark(self, partition_id: int) -> int:
        mark = await self._rpc.high_water_mark(partition_id)
        state = self._partitions.get(partition_id)
        if state is not None:
            state.learned(mark)
        return mark

    async def find_time(self, partition_id: int, timestamp_ms: int) -> int:
        """The ID of the partition's first committed transaction whose commit time is at or
        after ``timestamp_ms`` (ms since the Unix epoch), or its high-water mark + 1 when
        none is: where a read "from this time on" starts. Never below the log start. A
        transaction committed before commit times existed counts as earlier than any
        time. The storage nodes find it through each segment's times, a few reads however
        long the log. ``WaltzError`` from a server older than client protocol 3."""
        return await self._rpc.find_time(partition_id, timestamp_ms)

    def partition_stats(self) -> dict[int, PartitionStats]:
        """Each partition this client mounts or writes to: the high-water mark it knows
        of, its applied mark, the lag between them (in transactions, and how long the
        oldest unapplied one has been known), appends outstanding, retries and lock
        failures. The known mark comes from the feed as it arrives, Flush answers and
        ``high_water_mark`` reads; ``refresh_high_water_marks`` asks the servers (the
        feed of an application that fell far behind is held back at the server). Safe
        to call from another thread (a metrics scrape)."""
        now = time.monotonic()  # FeedLag's clock (not the loop's: uvloop's differs)
        stats = {}
        for p, state in sorted(self._partitions.items()):
            core = state.core
            lag, lag_seconds = core.lag.behind(core.applied, now)
            stats[p] = PartitionStats(
                partition_id=p,
                applies=core.applies,
                mounted=state.ready.is_set() and not self._closed,
                high_water_mark=max(core.lag.known_high_water_mark, core.applied),
                applied=core.applied,
                lag=lag,
                lag_seconds=lag_seconds,
                outstanding_appends=len(core.monitor),
                retries=core.retries,
                lock_failures=core.lock_failures,
            )
        return stats

    async def refresh_high_water_marks(self) -> None:
        """Ask the servers for the high-water mark of every partition this client follows
        (``partition_stats`` then counts what the feed has not brought yet)."""
        await asyncio.gather(*(self.high_water_mark(p) for p in list(self._partitions)))

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
        when the read reaches it), with their data and commit time (``Record.timestamp``,
        ``NO_TIMESTAMP`` where there is none), in order."""
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
        different batches at the same time. Checked batches are of record format 2
        (``Record.timestamp``, ``RecordBatch.timestamps()``: each commit time, or
        ``NO_TIMESTAMP`` where a record has none, as from a server older than commit
        times). ``checked=False`` yields ``UncheckedRecords`` as the server sent them
        (their ``format`` says which) whose first ID is the one asked for: the caller
        must check them (``UncheckedRecords.check``, or as the Spark source converts
        them)."""
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
