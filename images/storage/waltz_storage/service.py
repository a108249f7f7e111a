"""A storage node: its control file and the partitions it holds, opened and recovered,
and the requests of several partitions made durable together (group commit across
partitions: ``process_group``). One partition's requests are ``PartitionService``'s.
"""

from __future__ import annotations

import contextvars
import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import replace

from waltz_client.cluster.metadata import key_fingerprint
from waltz_client.runtime.json_logs import PARTITION, SESSION, log_context
from waltz_client.wire.storage_messages import (
    FailureResponse,
    OpenRequest,
    StorageError,
    StorageMessage,
    SuccessResponse,
)

from .control_file import (
    CONTROL_FILE_NAME,
    NO_SESSION,
    NO_TRANSACTION,
    ControlFile,
    PartitionInfo,
)
from .engine_settings import EngineSettings
from .errors import ControlFileError, PartitionRefused, StorageEngineError
from .group_sync import GroupSync, already_durable
from .metrics import StorageMetrics
from .partition import PartitionLog
from .partition_service import PartitionService, PendingAppends, SessionAuthority
from .session_checks import ReadSessions, SessionChecks

log = logging.getLogger(__name__)


def process_group(
    group: list[tuple[PartitionService, list[StorageMessage]]],
    group_sync: GroupSync,
    metrics: StorageMetrics,
) -> list[list[StorageMessage]]:
    """Each partition's requests in order; the responses of each. The appends become
    durable before any is answered: with one group sync when several partitions appended."""
    several = len(group) > 1
    locked: list[PartitionService] = []
    try:
        for service, _ in group:
            service.lock.__enter__()
            locked.append(service)
            if several:
                # One control-file fsync for the group (``_sync_control``), not one a
                # partition: a server recovering a hundred partitions at once fences and
                # cleans them all on each node.
                service.defer_control_sync = True
        if several:
            _read_sessions_ahead(group)
        pending = []
        for service, requests in group:
            tokens = _enter_log_context(service, requests)
            try:
                pending.append(service.write(requests))
            finally:
                _leave_log_context(tokens)
        appending = [p for p in pending if p.unsynced]
        sync_data: Callable[[int], None] | None = None  # None: each partition its own fsync
        if len(appending) > 1 and group_sync.available:
            sync_data = already_durable
            started = time.perf_counter()
            try:
                group_sync.make_durable([p.service.active_segment for p in appending])
            except OSError as e:
                sync_data = _failing(e)
            else:
                elapsed = time.perf_counter() - started
                metrics.group_sync_seconds.labels(group_sync.method).observe(elapsed)
        for p in appending:
            token = PARTITION.set(p.service.partition_id)
            try:
                p.service.commit(p, sync_data)
            finally:
                PARTITION.reset(token)
        if several:
            _sync_control(pending)  # last: a failure replaces every answer of its partition
        return [p.responses for p in pending]  # type: ignore[misc]
    finally:
        _release(locked, several)


def _release(locked: list[PartitionService], several: bool) -> None:
    """End a group: what it set on its partitions cleared, their locks released in the
    reverse order of taking them, every one even when one fails (as nested ``with``
    blocks would), the first failure raised after."""
    failure: BaseException | None = None
    for service in reversed(locked):
        if several:
            service.defer_control_sync = False
            service.recorded_ahead = None
        try:
            service.lock.__exit__(None, None, None)
        except BaseException as e:
            failure = failure or e
    if failure is not None:
        raise failure


def _read_sessions_ahead(group: list[tuple[PartitionService, list[StorageMessage]]]) -> None:
    """The recorded sessions of the group's partitions whose requests bring a new one,
    read together (``SessionChecks.read_ahead``) rather than one partition after
    another as each request is fenced; for the rest of the group (``process_group``
    clears them at its end)."""
    checks = group[0][0].session_checks
    if checks is None:
        return
    wanted = {}
    for service, requests in group:
        newest = max((r.session_id for r in requests), default=NO_SESSION)
        if newest > service.info.fence_session_id:
            wanted[service.partition_id] = newest
    if len(wanted) < 2:
        return
    recorded = checks.read_ahead(wanted)
    for service, _ in group:
        if service.partition_id in recorded:
            service.recorded_ahead = recorded[service.partition_id]


def _sync_control(pending: list[PendingAppends]) -> None:
    """One fsync of each control file the group's partitions wrote without one; a
    failure fails those partitions and all their answers (``control_synced``)."""
    written = [p for p in pending if p.service.control_unsynced]
    controls = {id(p.service.control): p.service.control for p in written}
    errors: dict[int, OSError | None] = {}
    for key, control in controls.items():
        try:
            control.sync()
            errors[key] = None
        except OSError as e:
            errors[key] = e
    for p in written:
        with log_context(partition=p.service.partition_id):
            p.service.control_synced(p, errors[id(p.service.control)])


def _enter_log_context(
    service: PartitionService, requests: list[StorageMessage]
) -> tuple[contextvars.Token[int | None], contextvars.Token[int | None] | None]:
    """What a partition's requests log names: the partition, and the server's session
    when they all come from one. Set directly, without a ``log_context`` object: this
    runs for every partition of every group."""
    session: int | None = requests[0].session_id if requests else None
    if any(r.session_id != session for r in requests):
        session = None
    return (
        PARTITION.set(service.partition_id),
        None if session is None else SESSION.set(session),
    )


def _leave_log_context(
    tokens: tuple[contextvars.Token[int | None], contextvars.Token[int | None] | None],
) -> None:
    partition, session = tokens
    if session is not None:
        SESSION.reset(session)
    PARTITION.reset(partition)


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


def partition_count_refusal(requested: int, held: int) -> str | None:
    """Why an Open with ``requested`` partitions is refused by a node whose control file
    has ``held`` (None: accepted). Fewer is accepted: the cluster grew and the peer has
    not read it yet; it addresses only partitions that exist here too."""
    if requested < 1:
        return f"the request's partition count {requested} is not a partition count"
    if requested > held:
        return (
            f"the cluster has {requested} partitions by the request, but this storage node "
            f"has only {held} by its control file: it has not followed the cluster's growth "
            f"yet (try again shortly)"
        )
    return None


def _grow(control: ControlFile, new_count: int) -> bool:
    before = control.num_partitions
    grew = control.grow(new_count)
    if grew:
        log.info("%s: grew from %d to %d partitions", control.path, before, new_count)
    return grew


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
        self,
        authority: SessionAuthority,
        log_starts: SessionAuthority | None = None,
        read_many: ReadSessions | None = None,
    ) -> None:
        """From now on, adopt a newer session (and move the log start up) only once the
        cluster metadata records it; refusals of sessions are remembered for a moment
        (``session_checks``: its ``forget`` is for a watch of the metadata). ``read_many``
        reads several partitions' sessions in one round trip, for groups."""
        self.session_checks = SessionChecks(authority, self.metrics, read_many=read_many)
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

        A key mismatch with an existing control file raises ControlFileError, and so does
        a control file with more partitions than ``num_partitions``; one with fewer grows
        (the cluster grew while this node was down). A partition that fails to open is
        kept as unavailable, with the reason, and the others serve.
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
            if control.num_partitions > num_partitions:
                # Partitions never shrink: another cluster's file, or a wrong setting.
                raise ControlFileError(
                    f"{control.path} has {control.num_partitions} partitions, but this node is "
                    f"configured with {num_partitions}"
                )
            bad = sorted(p for p in partitions if not 0 <= p < num_partitions)
            if bad:
                raise ControlFileError(f"partitions {bad} are outside 0..{num_partitions - 1}")
            _grow(control, num_partitions)
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
        with log_context(partition=partition_id):
            return StorageNode._open_partition_here(
                directory, control, partition_id, settings, metrics
            )

    @staticmethod
    def _open_partition_here(
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

    def grow(self, new_count: int) -> bool:
        """The cluster now has ``new_count`` partitions: grow the control file (crash-safe,
        see ``ControlFile.grow``); True if it grew. From then on partitions below
        ``new_count`` can be added and Opens with that count are accepted. Fewer than
        now raises ControlFileError (partitions never shrink). Blocking: a worker thread."""
        return _grow(self.control, new_count)

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
        """The answer to a connection's Open request: the cluster key must match, and the
        partition count must not be above this node's. A lower count is a peer that has
        not seen the cluster grow yet (it only addresses partitions that exist); a higher
        one is growth this node has not followed yet (the peer tries again)."""
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
        refusal = partition_count_refusal(request.num_partitions, self.num_partitions)
        if refusal is not None:
            self.metrics.errors.labels(StorageError.PARTITION_COUNT_MISMATCH.name).inc()
            return FailureResponse(s, q, p, StorageError.PARTITION_COUNT_MISMATCH, refusal)
        return SuccessResponse(s, q, p)

    def close(self) -> None:
        for svc in self.partitions.values():
            svc.close()
        self.group_sync.close()
        self.control.close()
