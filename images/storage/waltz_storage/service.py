"""Request handling of a storage node: the decisions, without sockets.

``StorageNode`` owns the control file and the partitions this node holds.
``PartitionService.process`` takes the requests queued for one partition, in
arrival order, and returns their responses: session fencing first, then the
request itself; consecutive appends share one fsync (group commit), and no
Success is produced for an append before that fsync returns.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace

from waltz_client.cluster.metadata import key_fingerprint
from waltz_client.wire.storage_messages import (
    NO_SPACE_MESSAGE,
    AppendRequest,
    FailureResponse,
    LastSessionInfoRequest,
    LastSessionInfoResponse,
    LogInfoRequest,
    LogInfoResponse,
    MaxTransactionIdRequest,
    MaxTransactionIdResponse,
    OpenRequest,
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

from .control_file import (
    CONTROL_FILE_NAME,
    NO_SESSION,
    NO_TRANSACTION,
    ControlFile,
    PartitionInfo,
)
from .errors import (
    ControlFileError,
    CorruptSegment,
    NonContiguousAppend,
    OutOfSpace,
    PartitionRefused,
    StorageEngineError,
    TransactionNotFound,
    TruncateRefused,
)
from .group_sync import GroupSync, already_durable
from .metrics import PublishingLock, StorageMetrics
from .partition import DEFAULT_MAX_TORN_BYTES, DEFAULT_SEGMENT_BYTES, PartitionLog
from .recovery import repair_hint
from .segment import Segment
from .session_checks import SessionChecks

log = logging.getLogger(__name__)

DEFAULT_MAX_RESPONSE_BYTES = 8 * 1024 * 1024

# What the cluster metadata records for a partition: its newest store session (the
# server writes a session there before it uses it), or its log start. Blocking.
SessionAuthority = Callable[[int], int]


@dataclass(frozen=True, slots=True)
class EngineSettings:
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    # Bytes a crash can leave unsynced at the end of a log: one write group.
    max_torn_bytes: int = DEFAULT_MAX_TORN_BYTES
    # Partitions syncing at once share one flush (group_sync.py); off: one fsync each.
    group_sync: bool = True
    # On ext2/3/4, by pages written back and one fdatasync; off: one syncfs.
    group_sync_write_back: bool = True


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
        self._fsyncs = metrics.fsyncs.labels(self._label)
        self._fsync_seconds = metrics.fsync_seconds.labels(self._label)
        self._appended_records = metrics.appended_records.labels(self._label)
        self._appended_bytes = metrics.appended_bytes.labels(self._label)
        # Serialises process() and close(); on release it publishes the state that
        # snapshot() returns, so a metrics scrape never waits behind an fsync.
        self._lock = PublishingLock(self._state)
        # Set by the daemon when it follows ZooKeeper: a newer session is adopted only
        # once the metadata records it, so a stranger cannot fence the owner out.
        self.session_checks: SessionChecks | None = None
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
        self._fsyncs.inc()
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
        self._appended_records.inc(records)
        self._appended_bytes.inc(data_bytes)
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
                self.info = self._control.write_partition(
                    self.partition_id, replace(self.info, fence_session_id=request.session_id)
                )
            except OSError as e:
                self._fail(f"could not persist session {request.session_id}: {e}")
                return self._failure(request, StorageError.IO_ERROR, self.unavailable or "")
        return None

    def _unrecorded(self, session_id: int) -> str | None:
        """Why ``session_id`` may not be adopted, or None when the metadata records it."""
        checks = self.session_checks
        return None if checks is None else checks.check(self.partition_id, session_id)

    def _check_log_start(self, log_start: int) -> None:
        """Refuse a log start the cluster metadata does not record (a server records it
        there before deleting anything), so no peer can wipe a partition's history."""
        authority = self.log_start_authority
        if authority is None:
            return
        p = self.partition_id
        try:
            recorded = authority(p)
        except Exception as e:
            raise TruncateRefused(
                f"partition {p}: cannot check log start {log_start} against the cluster "
                f"metadata ({type(e).__name__}: {e}); retry"
            ) from None
        if log_start > recorded:
            raise TruncateRefused(
                f"partition {p}: log start {log_start} is beyond the one the cluster metadata "
                f"records ({recorded}); a server records the log start before moving it"
            )

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
                local = min(mark, log_.max_txid)
                if local < self.info.local_low_water_mark:
                    raise TruncateRefused(
                        f"partition {self.partition_id}: session {s} would lower the local "
                        f"low-water mark from {self.info.local_low_water_mark} to {local}; "
                        f"the committed prefix never shrinks"
                    )
                self.info = self._control.write_partition(
                    self.partition_id,
                    replace(
                        self.info,
                        session_id=s,
                        low_water_mark=mark,
                        local_low_water_mark=local,
                    ),
                )
                return SuccessResponse(s, q, p)
            case TruncateRequest(transaction_id=txid):
                floor = self.info.local_low_water_mark
                if txid < floor:
                    raise TruncateRefused(
                        f"partition {self.partition_id}: truncating to {txid} would drop "
                        f"transactions up to the local low-water mark {floor}, which are "
                        f"committed"
                    )
                if txid < log_.max_txid and s <= self._no_truncate_through:
                    raise TruncateRefused(
                        f"partition {self.partition_id}: session {s} may not truncate here: "
                        f"it appended to this replica, or was current when the node started "
                        f"(a store session truncates only before it appends)"
                    )
                log_.truncate(txid)
                return SuccessResponse(s, q, p)
            case LogInfoRequest():
                stats = tuple(SegmentStats(*row) for row in log_.segment_stats())
                return LogInfoResponse(s, q, p, log_.log_start, log_.max_txid, stats)
            case SetLogStartRequest(log_start=start):
                if start > log_.log_start:
                    self._check_log_start(start)
                    if start > log_.max_txid + 1 and s <= self._no_truncate_through:
                        raise TruncateRefused(
                            f"partition {self.partition_id}: session {s} may not skip this "
                            f"replica ahead to {start}: it appended here"
                        )
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


def process_group(
    group: list[tuple[PartitionService, list[StorageMessage]]],
    group_sync: GroupSync,
    metrics: StorageMetrics,
) -> list[list[StorageMessage]]:
    """Each partition's requests in order; the responses of each. The appends become
    durable before any is answered: with one group sync when several partitions appended."""
    with contextlib.ExitStack() as held:
        pending = []
        for service, requests in group:
            held.enter_context(service.lock)
            pending.append(service.write(requests))
        appending = [p for p in pending if p.unsynced]
        if len(appending) > 1 and group_sync.available:
            sync_data: Callable[[int], None] = already_durable
            started = time.perf_counter()
            try:
                group_sync.make_durable([p.service.active_segment for p in appending])
            except OSError as e:
                sync_data = _failing(e)
            else:
                elapsed = time.perf_counter() - started
                metrics.group_sync_seconds.labels(group_sync.method).observe(elapsed)
            for p in appending:
                p.service.commit(p, sync_data)
        else:
            for p in appending:
                p.service.commit(p)
        return [p.responses for p in pending]  # type: ignore[misc]


def process_in_order(
    requests: list[tuple[PartitionService, StorageMessage]],
    group_sync: GroupSync,
    metrics: StorageMetrics,
) -> list[StorageMessage]:
    """``process_group`` for requests of any partitions as they arrived: the responses in
    the same order."""
    by_partition: dict[PartitionService, list[int]] = {}
    for i, (service, _) in enumerate(requests):
        by_partition.setdefault(service, []).append(i)
    answered = process_group(
        [(service, [requests[i][1] for i in at]) for service, at in by_partition.items()],
        group_sync,
        metrics,
    )
    responses: list[StorageMessage | None] = [None] * len(requests)
    for at, partition_responses in zip(by_partition.values(), answered, strict=True):
        for i, response in zip(at, partition_responses, strict=True):
            responses[i] = response
    return responses  # type: ignore[return-value]


def _failing(error: OSError) -> Callable[[int], None]:
    """A segment's ``sync_data`` after a group sync that failed: its appends fail too."""

    def sync_data(fd: int) -> None:
        raise error

    return sync_data


def holds_state(info: PartitionInfo) -> bool:
    """Did a store session set this partition's low-water marks on this node?"""
    return (info.session_id, info.low_water_mark, info.local_low_water_mark) != (
        NO_SESSION,
        NO_TRANSACTION,
        NO_TRANSACTION,
    )


def _forget_state(
    control: ControlFile, partition_id: int, info: PartitionInfo, path: str
) -> PartitionInfo:
    """The partition's directory is gone (the repair: moved aside or removed): start it
    empty as a new replica. No session and no marks make it one the server's recovery
    trusts with nothing (it copies the log back); the fence session stays, so older
    sessions are still refused."""
    log.warning(
        "partition %d: %s does not exist but the control file records session %d with "
        "local low-water mark %d: starting it empty, as a new replica (the server's recovery "
        "copies the log back)",
        partition_id,
        path,
        info.session_id,
        info.local_low_water_mark,
    )
    return control.write_partition(
        partition_id,
        replace(
            info,
            session_id=NO_SESSION,
            low_water_mark=NO_TRANSACTION,
            local_low_water_mark=NO_TRANSACTION,
        ),
    )


class StorageNode:
    """The control file and the partitions held by one storage node."""

    def __init__(
        self,
        directory: str,
        control: ControlFile,
        services: dict[int, PartitionService],
        metrics: StorageMetrics,
        settings: EngineSettings | None = None,
    ) -> None:
        self.settings = settings or EngineSettings()
        self.directory = directory
        self.control = control
        self.partitions = services
        self.metrics = metrics
        self.session_checks: SessionChecks | None = None
        self.log_start_authority: SessionAuthority | None = None
        self.group_sync = GroupSync.for_directory(
            directory, self.settings.group_sync, self.settings.group_sync_write_back
        )

    def process_group(
        self, group: list[tuple[PartitionService, list[StorageMessage]]]
    ) -> list[list[StorageMessage]]:
        """See ``process_group``: run on the node's I/O thread."""
        return process_group(group, self.group_sync, self.metrics)

    def process_in_order(
        self, requests: list[tuple[PartitionService, StorageMessage]]
    ) -> list[StorageMessage]:
        """See ``process_in_order``: run on the node's I/O thread."""
        return process_in_order(requests, self.group_sync, self.metrics)

    def verify_sessions_with(
        self, authority: SessionAuthority, log_starts: SessionAuthority | None = None
    ) -> None:
        """From now on, adopt a newer session (and move the log start up) only once the
        cluster metadata records it; refusals of sessions are remembered for a moment
        (``session_checks``: its ``forget`` is for a watch of the metadata)."""
        self.session_checks = SessionChecks(authority, self.metrics)
        self.log_start_authority = log_starts
        for svc in self.partitions.values():
            svc.session_checks = self.session_checks
            svc.log_start_authority = log_starts

    @property
    def cluster_key(self) -> uuid.UUID:
        return self.control.cluster_key

    @property
    def num_partitions(self) -> int:
        return self.control.num_partitions

    @classmethod
    def open(
        cls,
        directory: str,
        cluster_key: uuid.UUID,
        num_partitions: int,
        partitions: set[int],
        settings: EngineSettings | None = None,
        metrics: StorageMetrics | None = None,
    ) -> StorageNode:
        """Open (or initialise) the storage directory and recover each held partition.

        A key or partition-count mismatch with an existing control file raises
        ControlFileError. A partition that fails to open is kept as unavailable,
        with the reason, and the others serve.
        """
        settings = settings or EngineSettings()
        metrics = metrics or StorageMetrics()
        os.makedirs(directory, exist_ok=True)
        if os.path.exists(os.path.join(directory, CONTROL_FILE_NAME)):
            control = ControlFile.open(directory)
        else:
            leftovers = sorted(name for name in os.listdir(directory) if name.isdigit())
            if leftovers:
                # Without the control file the fencing session is unknown: a stale
                # server could write again. Never re-initialise over existing data.
                raise ControlFileError(
                    f"{directory}: no {CONTROL_FILE_NAME} but partition directories "
                    f"{', '.join(leftovers)} exist; refusing to initialise over existing data"
                )
            control = ControlFile.create(directory, cluster_key, num_partitions)
            log.info(
                "initialised %s for cluster %s with %d partitions",
                directory,
                key_fingerprint(cluster_key),
                num_partitions,
            )
        try:
            if control.cluster_key != cluster_key:
                raise ControlFileError(
                    f"{control.path} belongs to the cluster whose key is "
                    f"{key_fingerprint(control.cluster_key)}, but this node is configured with "
                    f"the key {key_fingerprint(cluster_key)}"
                )
            if control.num_partitions != num_partitions:
                raise ControlFileError(
                    f"{control.path} has {control.num_partitions} partitions, but this node is "
                    f"configured with {num_partitions}"
                )
            bad = sorted(p for p in partitions if not 0 <= p < num_partitions)
            if bad:
                raise ControlFileError(f"partitions {bad} are outside 0..{num_partitions - 1}")
        except BaseException:
            control.close()
            raise
        services = {
            p: cls._open_partition(directory, control, p, settings, metrics)
            for p in sorted(partitions)
        }
        node = cls(directory, control, services, metrics, settings)
        metrics.watch_partitions(lambda: list(node.partitions.values()))
        metrics.watch_disk(directory)
        return node

    @staticmethod
    def _open_partition(
        directory: str,
        control: ControlFile,
        partition_id: int,
        settings: EngineSettings,
        metrics: StorageMetrics,
    ) -> PartitionService:
        path = os.path.join(directory, str(partition_id))
        info = PartitionInfo()
        try:
            info = control.read_partition(partition_id)
            if not os.path.isdir(path) and holds_state(info):
                info = _forget_state(control, partition_id, info, path)
            plog = PartitionLog.open(
                path,
                partition_id,
                control.cluster_key,
                segment_bytes=settings.segment_bytes,
                max_torn_bytes=settings.max_torn_bytes,
                floor=info.local_low_water_mark,
            )
        except PartitionRefused as e:
            log.error("partition %d refuses to open: %s", partition_id, e)
            return PartitionService(
                partition_id,
                control,
                settings,
                metrics,
                info=info,
                unavailable=str(e),
                recovered_end=e.recovered_end,
            )
        except (StorageEngineError, OSError) as e:
            log.error("partition %d refuses to open: %s", partition_id, e)
            return PartitionService(
                partition_id, control, settings, metrics, info=info, unavailable=str(e)
            )
        log.info(
            "partition %d open: transactions %d..%d, session %d, low-water mark %d",
            partition_id,
            plog.first_txid,
            plog.max_txid,
            info.fence_session_id,
            info.low_water_mark,
        )
        return PartitionService(partition_id, control, settings, metrics, plog, info)

    def add_partition(self, partition_id: int) -> PartitionService:
        """Open (creating if new) a partition newly assigned to this node."""
        if not 0 <= partition_id < self.num_partitions:
            raise ControlFileError(
                f"partition {partition_id} is outside 0..{self.num_partitions - 1}"
            )
        existing = self.partitions.get(partition_id)
        if existing is not None:
            return existing
        svc = self._open_partition(
            self.directory, self.control, partition_id, self.settings, self.metrics
        )
        svc.session_checks = self.session_checks
        svc.log_start_authority = self.log_start_authority
        self.partitions = {**self.partitions, partition_id: svc}
        return svc

    def partitions_with_state(self) -> set[int]:
        """Partitions a store session left marks on here (held now or not): after a
        restart, those no longer assigned may still be needed for a vote."""
        found = set()
        for p in range(self.num_partitions):
            try:
                info = self.control.read_partition(p)
            except ControlFileError:
                continue  # damaged: it could not serve anyway
            if holds_state(info):
                found.add(p)
        return found

    def remove_partition(self, partition_id: int) -> None:
        """Stop holding a partition (its files stay on disk)."""
        svc = self.partitions.get(partition_id)
        if svc is not None:
            self.partitions = {p: s for p, s in self.partitions.items() if p != partition_id}
            svc.close()

    def check_open(self, request: OpenRequest) -> StorageMessage:
        """The answer to a connection's Open request: cluster key and partition count must match."""
        s, q, p = request.session_id, request.seq, request.partition_id
        if request.cluster_key != self.cluster_key:
            self.metrics.errors.labels(StorageError.CLUSTER_KEY_MISMATCH.name).inc()
            return FailureResponse(
                s,
                q,
                p,
                StorageError.CLUSTER_KEY_MISMATCH,
                "the Open request's cluster key does not match this storage node's cluster",
            )
        if request.num_partitions != self.num_partitions:
            self.metrics.errors.labels(StorageError.PARTITION_COUNT_MISMATCH.name).inc()
            return FailureResponse(
                s,
                q,
                p,
                StorageError.PARTITION_COUNT_MISMATCH,
                f"the cluster has {request.num_partitions} partitions by the request, "
                f"{self.num_partitions} by this storage node's control file",
            )
        return SuccessResponse(s, q, p)

    def close(self) -> None:
        for svc in self.partitions.values():
            svc.close()
        self.group_sync.close()
        self.control.close()
