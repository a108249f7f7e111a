"""One partition's request handling on a storage node: the decisions, without sockets.

``PartitionService.process`` takes the requests queued for one partition, in arrival
order, and returns their responses: session fencing first, then the request itself;
consecutive appends share one fsync (group commit), and no Success is produced for an
append before that fsync returns. What may shrink the partition (its low-water mark, a
truncate, its log start) is decided by ``truncate_rules``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from waltz_client.wire.storage_messages import (
    NO_SPACE_MESSAGE,
    AppendRequest,
    FailureResponse,
    FindTimeRequest,
    FindTimeResponse,
    LastSessionInfoRequest,
    LastSessionInfoResponse,
    LogInfoRequest,
    LogInfoResponse,
    MaxTransactionIdRequest,
    MaxTransactionIdResponse,
    RecordHeaderListRequest,
    RecordHeaderListResponse,
    RecordHeaderRequest,
    RecordHeaderResponse,
    RecordListRequest,
    RecordListResponse,
    RecordRequest,
    RecordResponse,
    SegmentStats,
    SetLogStartRequest,
    SetLowWaterMarkRequest,
    StorageError,
    StorageMessage,
    SuccessResponse,
    TruncateRequest,
)

from .control_file import ControlFile, PartitionInfo
from .engine_settings import EngineSettings
from .errors import (
    CorruptSegment,
    NonContiguousAppend,
    OutOfSpace,
    TransactionNotFound,
    TruncateRefused,
)
from .metrics import PublishingLock, StorageMetrics
from .partition import PartitionLog
from .recovery import repair_hint
from .segment import Segment
from .session_checks import SessionChecks
from .truncate_rules import (
    local_low_water_mark,
    log_start_refusal,
    low_water_mark_refusal,
    truncate_refusal,
    unchecked_log_start,
)

log = logging.getLogger(__name__)

# What the cluster metadata records for a partition: its newest store session (the
# server writes a session there before it uses it), or its log start. Blocking.
SessionAuthority = Callable[[int], int]


@dataclass(slots=True)
class PendingAppends:
    """What ``PartitionService.write`` did with a list of requests: a response for each,
    None for the appends written but not yet durable (indexes in ``unsynced``)."""

    service: PartitionService
    requests: list[StorageMessage]
    responses: list[StorageMessage | None]
    unsynced: list[int]


class PartitionService:
    """One partition's log, session state and request handling. Callers serialise calls."""

    def __init__(
        self,
        partition_id: int,
        control: ControlFile,
        settings: EngineSettings,
        metrics: StorageMetrics,
        log_: PartitionLog | None = None,
        info: PartitionInfo | None = None,
        unavailable: str | None = None,
        recovered_end: int = -1,
    ) -> None:
        self.partition_id = partition_id
        self._control = control
        self._settings = settings
        self._metrics = metrics
        self.log = log_
        self.info = info or PartitionInfo()
        self.unavailable = unavailable  # why the partition serves nothing, or None
        self.failed_after_open = False  # an fsync failed: a restart recovers
        # The disk is full (an append found no space): the partition still serves, the
        # next append that fits clears it; none is acknowledged meanwhile.
        self.out_of_space: str | None = None
        # Where the log ended before the appends written and not yet synced: they are
        # undone back to it when their index entries find no room.
        self._unsynced_after = -1
        self._recovered_end = recovered_end  # a refused partition: where its intact log ends
        self._label = str(partition_id)
        # This partition's series, looked up once: labels() on every append costs CPU.
        self._fsync_seconds = metrics.fsync_seconds.labels(self._label)
        # Counted here and published with the state (``_state``): a prometheus counter's
        # inc takes a lock of its own, three times an append.
        self._fsyncs = 0
        self._appended_records = 0
        self._appended_bytes = 0
        # Serialises process() and close(); on release it publishes the state that
        # snapshot() returns, so a metrics scrape never waits behind an fsync.
        self._lock = PublishingLock(self._state)
        # Set by ``process_group`` for a group of several partitions: this partition's
        # control-file writes (a newer session adopted, a low-water mark) leave their
        # fsync to one for the whole group, made before any of its answers goes.
        self.defer_control_sync = False
        self.control_unsynced = False  # written since, not yet synced
        # Set by the daemon when it follows ZooKeeper: a newer session is adopted only
        # once the metadata records it, so a stranger cannot fence the owner out.
        self.session_checks: SessionChecks | None = None
        # The session the metadata recorded, read for the group being processed with its
        # other partitions' (``process_group``); None outside it.
        self.recorded_ahead: int | None = None
        # Likewise, the log start moves up only as far as the metadata records.
        self.log_start_authority: SessionAuthority | None = None
        # A store session truncates only before it appends: no Truncate in a session
        # that appended here, or that was current when this node opened (a session
        # never continues on a replica it lost its connection to).
        self._no_truncate_through = self.info.fence_session_id

    def snapshot(self) -> dict[str, float]:
        """The state as of the last release of the lock (the end of a process() call),
        without taking it: a scrape must not wait for an fsync in progress."""
        return dict(self._lock.published)

    def _state(self) -> dict[str, float]:
        """Read under the lock (PublishingLock calls it on release)."""
        log_ = self.log
        return {
            "max_transaction_id": log_.max_txid if log_ else self._recovered_end,
            "low_water_mark": self.info.low_water_mark,
            "local_low_water_mark": self.info.local_low_water_mark,
            "session_id": self.info.fence_session_id,
            "available": 0 if self.unavailable or log_ is None else 1,
            "size_bytes": log_.size_bytes if log_ else 0,
            "log_start": log_.log_start if log_ else 0,
            "out_of_space": 1 if self.out_of_space else 0,
            "needs_restart": 1 if self.failed_after_open else 0,
            "fsyncs": self._fsyncs,
            "appended_records": self._appended_records,
            "appended_bytes": self._appended_bytes,
        }

    # --- the decisions ------------------------------------------------------------------

    def process(self, requests: list[StorageMessage]) -> list[StorageMessage]:
        """Handle ``requests`` in order; return one response per request, in the same order."""
        with self._lock:
            pending = self.write(requests)
            self.commit(pending)
            return pending.responses  # type: ignore[return-value]

    def write(self, requests: list[StorageMessage]) -> PendingAppends:
        """Handle ``requests`` in order, leaving the appends at the end written but not yet
        durable (``commit`` finishes them). The caller holds ``lock``."""
        responses: list[StorageMessage | None] = []
        unsynced: list[int] = []  # indexes of appends written but not yet fsync'd
        for request in requests:
            if unsynced and not isinstance(request, AppendRequest):
                self._group_commit(requests, responses, unsynced)
            if not unsynced and self.log is not None:
                self._unsynced_after = self.log.max_txid
            response = self._handle(request)
            if response is None:
                unsynced.append(len(responses))
            responses.append(response)
        return PendingAppends(self, requests, responses, unsynced)

    def commit(
        self, pending: PendingAppends, sync_data: Callable[[int], None] | None = None
    ) -> None:
        """Make ``pending``'s appends durable (an fsync, or ``sync_data`` when a group sync
        covered them) and answer them. The caller holds ``lock``."""
        if pending.unsynced:
            self._group_commit(pending.requests, pending.responses, pending.unsynced, sync_data)

    @property
    def active_segment(self) -> Segment:
        """The segment appends go to: the only one a sync may find unsynced."""
        assert self.log is not None
        return self.log.segments[-1]

    @property
    def lock(self) -> PublishingLock:
        """Serialises requests and close(); publishes the state for scrapes on release."""
        return self._lock

    def _group_commit(
        self,
        requests: list[StorageMessage],
        responses: list[StorageMessage | None],
        unsynced: list[int],
        sync_data: Callable[[int], None] | None = None,
    ) -> None:
        """One fsync for every append written since the last; then they may succeed."""
        assert self.log is not None
        started = time.perf_counter()
        try:
            self.log.sync(sync_data)
        except OutOfSpace as e:
            # The records are durable but their index entries found no room. Nothing was
            # acknowledged, and a failed write (unlike a failed fsync) leaves nothing in
            # doubt: undo them all and serve on, as when the records find no room.
            reason = self._undo_for_space(self._unsynced_after, e)
            for i in unsynced:
                responses[i] = self._failure(requests[i], StorageError.IO_ERROR, reason)
            unsynced.clear()
            return
        except OSError as e:
            # After a failed fsync the page cache cannot be trusted (it may drop the dirty
            # pages and report success next time): stop serving until a restart recovers.
            self._fail(f"fsync failed: {e}")
            for i in unsynced:
                responses[i] = self._failure(requests[i], StorageError.IO_ERROR, self.unavailable)
            unsynced.clear()
            return
        self._fsyncs += 1
        if sync_data is None:  # its own fsync (a shared group sync is timed by the node)
            self._fsync_seconds.observe(time.perf_counter() - started)
        records = data_bytes = 0
        for i in unsynced:
            request = requests[i]
            assert isinstance(request, AppendRequest)
            records += len(request.records)
            data_bytes += request.records.data_bytes
            responses[i] = SuccessResponse(request.session_id, request.seq, request.partition_id)
        if self.out_of_space is not None:
            log.warning("partition %d: appends fit on the disk again", self.partition_id)
            self.out_of_space = None
        self._appended_records += records
        self._appended_bytes += data_bytes
        unsynced.clear()

    def _fail(self, reason: str) -> None:
        """Stop serving until a restart: after a failed fsync the page cache cannot be
        trusted (it may drop dirty pages and report success next time), and recovery
        on open rescans the files."""
        self.unavailable = f"{reason}; restart the node to recover"
        self.failed_after_open = True
        log.error("partition %d: %s", self.partition_id, self.unavailable)

    def _failure(
        self, request: StorageMessage, error: StorageError, message: str
    ) -> FailureResponse:
        self._metrics.errors.labels(error.name).inc()
        return FailureResponse(
            request.session_id, request.seq, request.partition_id, error, message
        )

    def _handle(self, request: StorageMessage) -> StorageMessage | None:
        """The response, or None for an append written and waiting for the group fsync."""
        if self.unavailable is not None or self.log is None:
            return self._failure(
                request,
                StorageError.PARTITION_UNAVAILABLE,
                f"partition {self.partition_id} is unavailable: {self.unavailable}",
            )
        fenced = self._fence(request)
        if fenced is not None:
            return fenced
        before = self.log.max_txid
        try:
            return self._dispatch(request)
        except NonContiguousAppend as e:
            return self._failure(request, StorageError.NON_CONTIGUOUS, str(e))
        except TransactionNotFound as e:
            return self._failure(request, StorageError.TRANSACTION_NOT_FOUND, str(e))
        except TruncateRefused as e:
            return self._failure(request, StorageError.TRUNCATE_REFUSED, str(e))
        except CorruptSegment as e:
            # Damage found by a read (it appeared since the open checked every record):
            # this replica can no longer serve what it acknowledged.
            assert self.log is not None
            self.unavailable = f"{e}; reads fail. {repair_hint(self.log.directory)}"
            log.error("partition %d: %s", self.partition_id, self.unavailable)
            return self._failure(request, StorageError.IO_ERROR, str(e))
        except OSError as e:
            if isinstance(request, AppendRequest) and isinstance(e, OutOfSpace):
                reason = self._undo_for_space(before, e)
                return self._failure(request, StorageError.IO_ERROR, reason)
            # A failed write or fsync leaves the files and our view of them in doubt.
            self._fail(f"I/O error on {type(request).__name__}: {e}")
            return self._failure(request, StorageError.IO_ERROR, self.unavailable or "")

    def _undo_for_space(self, before: int, error: OutOfSpace) -> str:
        """Appends the disk had no room for (their records, their index entries, a new
        segment): undo what of them was written, back to transaction ``before`` (a write
        that fails leaves page cache and files as they were, unlike a failed fsync), and
        keep serving: the next append that fits recovers, no restart. The reason to
        answer them with (IO_ERROR)."""
        assert self.log is not None
        try:
            self.log.undo_after(before)
        except OSError as e:
            self._fail(f"out of space, and undoing a partial append failed: {e}")
            return self.unavailable or ""
        reason = (
            f"partition {self.partition_id}: {NO_SPACE_MESSAGE} in {self.log.directory} "
            f"({error.strerror or error}); nothing was written. Free space (or let retention "
            f"delete old segments): appends resume by themselves"
        )
        if self.out_of_space is None:
            log.error("%s", reason)
        self.out_of_space = reason
        return reason

    def _fence(self, request: StorageMessage) -> FailureResponse | None:
        """Refuse older sessions; adopt (durably, before anything else) a newer one."""
        current = self.info.fence_session_id
        if request.session_id < current:
            return self._failure(
                request,
                StorageError.SESSION_FENCED,
                f"partition {self.partition_id}: session {request.session_id} is older than "
                f"the current session {current}",
            )
        if request.session_id > current:
            unknown = self._unrecorded(request.session_id)
            if unknown is not None:
                return self._failure(request, StorageError.SESSION_UNKNOWN, unknown)
            try:
                self.info = self._write_control(
                    replace(self.info, fence_session_id=request.session_id)
                )
            except OSError as e:
                self._fail(f"could not persist session {request.session_id}: {e}")
                return self._failure(request, StorageError.IO_ERROR, self.unavailable or "")
        return None

    def _write_control(self, info: PartitionInfo) -> PartitionInfo:
        stored = self._control.write_partition(
            self.partition_id, info, sync=not self.defer_control_sync
        )
        if self.defer_control_sync:
            self.control_unsynced = True
        return stored

    @property
    def control(self) -> ControlFile:
        return self._control

    def control_synced(self, pending: PendingAppends, error: OSError | None) -> None:
        """The group's fsync of the control file ran (``error``: it failed). Failed, what
        this partition wrote there is in doubt as after any failed fsync: it stops
        serving until a restart, and every answer of its group fails."""
        self.control_unsynced = False
        if error is None:
            return
        self._fail(f"fsync of the control file failed: {error}")
        reason = self.unavailable or ""
        pending.responses = [
            self._failure(r, StorageError.IO_ERROR, reason) for r in pending.requests
        ]

    def _unrecorded(self, session_id: int) -> str | None:
        """Why ``session_id`` may not be adopted, or None when the metadata records it."""
        checks = self.session_checks
        if checks is None:
            return None
        ahead = self.recorded_ahead
        if ahead is not None and session_id <= ahead:
            checks.accepted_ahead()
            return None
        return checks.check(self.partition_id, session_id)

    def _recorded_log_start(self, log_start: int) -> int | None:
        """The log start the cluster metadata records (None: no metadata followed);
        TruncateRefused when it cannot be read, to check moving it up to ``log_start``."""
        authority = self.log_start_authority
        if authority is None:
            return None
        try:
            return authority(self.partition_id)
        except Exception as e:
            raise TruncateRefused(unchecked_log_start(self.partition_id, log_start, e)) from None

    def _dispatch(self, request: StorageMessage) -> StorageMessage | None:
        log_ = self.log
        assert log_ is not None
        s, q, p = request.session_id, request.seq, request.partition_id
        max_bytes = self._settings.max_response_bytes
        match request:
            case AppendRequest(records=batch):
                log_.append(batch)
                self._no_truncate_through = max(self._no_truncate_through, s)
                return None
            case MaxTransactionIdRequest():
                return MaxTransactionIdResponse(s, q, p, log_.max_txid)
            case LastSessionInfoRequest():
                info = self.info
                return LastSessionInfoResponse(
                    s, q, p, info.session_id, info.low_water_mark, info.local_low_water_mark
                )
            case SetLowWaterMarkRequest(low_water_mark=mark):
                local = local_low_water_mark(mark, log_.max_txid)
                refused = low_water_mark_refusal(
                    self.partition_id, s, local, self.info.local_low_water_mark
                )
                if refused is not None:
                    raise TruncateRefused(refused)
                self.info = self._write_control(
                    replace(
                        self.info, session_id=s, low_water_mark=mark, local_low_water_mark=local
                    )
                )
                return SuccessResponse(s, q, p)
            case TruncateRequest(transaction_id=txid):
                refused = truncate_refusal(
                    self.partition_id,
                    s,
                    txid,
                    max_txid=log_.max_txid,
                    local_low_water_mark=self.info.local_low_water_mark,
                    no_truncate_through=self._no_truncate_through,
                )
                if refused is not None:
                    raise TruncateRefused(refused)
                log_.truncate(txid)
                return SuccessResponse(s, q, p)
            case LogInfoRequest():
                stats = tuple(SegmentStats(*row) for row in log_.segment_stats())
                return LogInfoResponse(s, q, p, log_.log_start, log_.max_txid, stats)
            case FindTimeRequest(timestamp=time_ms):
                return FindTimeResponse(s, q, p, log_.find_time(time_ms))
            case SetLogStartRequest(log_start=start):
                if start > log_.log_start:
                    refused = log_start_refusal(
                        self.partition_id,
                        s,
                        start,
                        max_txid=log_.max_txid,
                        recorded=self._recorded_log_start(start),
                        no_truncate_through=self._no_truncate_through,
                    )
                    if refused is not None:
                        raise TruncateRefused(refused)
                    freed = log_.advance_log_start(start)
                    self._metrics.retention_deleted_bytes.labels(self._label).inc(freed)
                return SuccessResponse(s, q, p)
            case RecordHeaderRequest(transaction_id=txid):
                headers = log_.read_headers(txid, 1, max_bytes) if txid <= log_.max_txid else []
                if not headers:
                    raise TransactionNotFound(
                        f"partition {self.partition_id}: no transaction {txid} "
                        f"(max is {log_.max_txid})"
                    )
                return RecordHeaderResponse(s, q, p, headers[0])
            case RecordRequest(transaction_id=txid):
                batch = log_.read(txid, 1, max_bytes)
                if not len(batch):
                    raise TransactionNotFound(
                        f"partition {self.partition_id}: no transaction {txid} "
                        f"(max is {log_.max_txid})"
                    )
                return RecordResponse(s, q, p, next(batch.records()))
            case RecordHeaderListRequest(transaction_id=txid, max_records=n):
                return RecordHeaderListResponse(
                    s, q, p, tuple(log_.read_headers(txid, n, max_bytes))
                )
            case RecordListRequest(transaction_id=txid, max_records=n):
                return RecordListResponse(s, q, p, log_.read(txid, n, max_bytes))
        return self._failure(
            request,
            StorageError.MALFORMED_REQUEST,
            f"{type(request).__name__} is not a partition request",
        )

    def close(self) -> None:
        with self._lock:
            if self.log is not None:
                self.log.close()
                self.log = None
