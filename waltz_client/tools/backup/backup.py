"""``waltz backup PATH``: copy every partition's committed log into a backup directory.

A run records each partition's high-water mark first (through the servers, as any
client sees it), then copies the transactions after what the backup already holds up
to that mark, with pipelined range reads, while the cluster keeps serving. Chunk files
are fsync'd and renamed into place before the manifest lists them; the manifest is
replaced atomically after every chunk, so a run that stops half way leaves a backup
that is whole up to its last recorded chunk, and the next run continues from there.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from kazoo.client import KazooClient

from waltz_client.client import MissingTransactions, WaltzClient, WaltzError
from waltz_client.cluster.admin import read_cluster
from waltz_client.cluster.errors import ClusterError
from waltz_client.cluster.metadata import key_fingerprint
from waltz_client.config import WaltzClientConfig
from waltz_client.wire.records import WIRE_RECORD_HEAD

from .format import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    BackupError,
    ChunkWriter,
    Manifest,
    PartitionBackup,
    SourceCluster,
    check_listed_files,
    leftover_files,
    with_files,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BackupSettings:
    chunk_bytes: int = 64 * 1024 * 1024  # a new chunk file once one reaches this size
    batch_records: int = 2000  # per range read
    batch_bytes: int = 4 * 1024 * 1024  # per range read
    in_flight: int = 4  # range reads under way at once, per partition
    parallel: int = 4  # partitions copied at once


@dataclass
class PartitionRun:
    partition: int
    high_water_mark: int  # recorded at the start of the run
    copied_from: int = -1
    copied_to: int = -1  # the last transaction copied by this run (-1: none)
    bytes: int = 0
    files: int = 0
    problem: str | None = None

    @property
    def records(self) -> int:
        return self.copied_to - self.copied_from + 1 if self.copied_to >= 0 else 0


@dataclass
class BackupResult:
    directory: str
    manifest: Manifest
    runs: list[PartitionRun] = field(default_factory=list)
    removed_leftovers: list[str] = field(default_factory=list)

    @property
    def problems(self) -> list[str]:
        return [r.problem for r in self.runs if r.problem]


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


def _prepare(directory: str) -> Manifest | None:
    """The existing backup's manifest (checked), or None for a new or empty directory."""
    if os.path.exists(os.path.join(directory, MANIFEST_NAME)):
        manifest = Manifest.read(directory)
        check_listed_files(directory, manifest)
        return manifest
    if os.path.isdir(directory):
        entries = [e for e in os.listdir(directory) if not e.startswith(".")]
        if entries:
            raise BackupError(
                f"{directory}: not empty and holds no {MANIFEST_NAME}: a backup goes into an "
                f"empty directory (or one that already holds a backup, to continue it)"
            )
    elif os.path.exists(directory):
        raise BackupError(f"{directory}: not a directory")
    return None


async def run_backup(
    directory: str,
    zk: KazooClient,
    config: WaltzClientConfig,
    settings: BackupSettings | None = None,
    progress: Callable[[str], None] = lambda message: None,
) -> BackupResult:
    """Back up (or continue backing up) the cluster at ``config.zk_root`` into
    ``directory``. BackupError when the backup cannot start; a partition that cannot be
    copied is reported in the result's problems, the others are copied."""
    settings = settings or BackupSettings()
    directory = os.path.abspath(directory)
    manifest = _prepare(directory)
    root = config.zk_root
    try:
        state = await asyncio.to_thread(read_cluster, zk, root)
    except ClusterError as e:
        raise BackupError(str(e)) from None
    params = state.params
    source = SourceCluster(
        params.name, root, key_fingerprint(params.key), params.num_partitions, params.num_replicas
    )
    if manifest is not None:
        have = manifest.source
        if have.key_fingerprint != source.key_fingerprint:
            raise BackupError(
                f"{directory} backs up the cluster {have.name!r} whose key is "
                f"{have.key_fingerprint}, not the cluster at {root} ({source.key_fingerprint}); "
                f"back this one up into another directory"
            )
        if have.num_partitions != source.num_partitions:
            raise BackupError(
                f"{directory} backs up {have.num_partitions} partitions, the cluster has "
                f"{source.num_partitions}"
            )
    log_starts = {p: m.log_start for p, m in state.partitions.items()}
    started = _now()
    os.makedirs(directory, exist_ok=True)
    removed = leftover_files(directory, manifest)
    for name in removed:  # chunks a stopped run wrote but never recorded
        progress(f"removing {name}: written by a run that stopped before recording it")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(directory, name))
    new_partitions: set[int] = set()
    if manifest is None:
        manifest = Manifest(
            source,
            started,
            {
                p: PartitionBackup(p, log_starts.get(p, 0), log_starts.get(p, 0) - 1, 0)
                for p in range(source.num_partitions)
            },
        )
        new_partitions = set(manifest.partitions)
        manifest.write(directory)
    # This run writes chunks of format 2 (an older build's backup goes on with them; its
    # manifest then says so, and that build no longer reads it).
    manifest.version = FORMAT_VERSION
    result = BackupResult(directory, manifest, removed_leftovers=removed)
    async with WaltzClient(config) as client:
        marks = await asyncio.gather(
            *(client.high_water_mark(p) for p in range(source.num_partitions)),
            return_exceptions=True,
        )
        window = asyncio.Semaphore(settings.parallel)

        async def one(p: int, mark: int | BaseException) -> PartitionRun:
            run = PartitionRun(p, mark if isinstance(mark, int) else -1)
            if isinstance(mark, BaseException):
                run.problem = f"partition {p}: no high-water mark: {mark}"
                return run
            async with window:
                try:
                    await _copy(
                        directory,
                        manifest,
                        client,
                        p,
                        mark,
                        log_starts.get(p, 0),
                        p in new_partitions,
                        settings,
                        run,
                    )
                except (WaltzError, BackupError, OSError) as e:
                    text = str(e)
                    run.problem = text if text.startswith("partition") else f"partition {p}: {e}"
            if run.problem is None:  # problems: the caller reports the result's
                progress(
                    f"partition {p}: copied {run.copied_from}..{run.copied_to} "
                    f"({run.records} records, {run.bytes} bytes, {run.files} files)"
                    if run.records
                    else f"partition {p}: nothing new (high-water mark {mark})"
                )
            return run

        result.runs = list(await asyncio.gather(*(one(p, m) for p, m in enumerate(marks))))
    manifest.runs.append(
        {
            "started": started,
            "finished": _now(),
            "high_water_marks": {
                str(r.partition): manifest.partitions[r.partition].high_water_mark
                for r in result.runs
            },
            "copied": {
                str(r.partition): [r.copied_from, r.copied_to] for r in result.runs if r.records
            },
            "records": sum(r.records for r in result.runs),
            "bytes": sum(r.bytes for r in result.runs),
            "problems": result.problems,
        }
    )
    manifest.write(directory)
    return result


async def _copy(
    directory: str,
    manifest: Manifest,
    client: WaltzClient,
    p: int,
    mark: int,
    log_start: int,
    new: bool,
    settings: BackupSettings,
    run: PartitionRun,
) -> None:
    b = manifest.partitions[p]
    if mark < b.high_water_mark:
        raise BackupError(
            f"partition {p}: the cluster's high-water mark is {mark}, but the backup already "
            f"holds transactions up to {b.high_water_mark}: it is not this cluster's history "
            f"(restored from an older backup?); back it up into another directory"
        )
    while True:
        start = b.high_water_mark + 1
        if start < log_start:
            raise _gap(p, b, log_start)
        if mark < start:
            b.source_log_start = log_start
            return
        try:
            await _copy_range(directory, manifest, client, p, start, mark, settings, run)
            manifest.partitions[p].source_log_start = log_start
            manifest.write(directory)
            return
        except MissingTransactions as e:
            b = manifest.partitions[p]
            if new and not b.files:
                # The first run of this backup, and retention moved the log start since
                # we read it: the backup begins where the log now begins.
                b.first = e.first_available
                b.high_water_mark = e.first_available - 1
                log_start = e.first_available
                continue
            raise _gap(p, b, e.first_available) from None


def _gap(p: int, b: PartitionBackup, log_start: int) -> BackupError:
    return BackupError(
        f"partition {p}: the backup holds transactions up to {b.high_water_mark}, but the "
        f"cluster's log now starts at {log_start}: retention deleted "
        f"{b.high_water_mark + 1}..{log_start - 1} before they were backed up, and that gap "
        f"cannot be filled. This backup still restores partition {p} up to "
        f"{b.high_water_mark}; start a new backup in an empty directory to keep what "
        f"follows (back up more often than retention deletes)"
    )


async def _copy_range(
    directory: str,
    manifest: Manifest,
    client: WaltzClient,
    p: int,
    start: int,
    stop: int,
    settings: BackupSettings,
    run: PartitionRun,
) -> None:
    writer: ChunkWriter | None = None
    generation = 0

    def seal() -> None:
        nonlocal writer, generation
        assert writer is not None
        chunk = writer.finish()
        writer = None
        manifest.partitions[p] = with_files(manifest.partitions[p], chunk, generation)
        manifest.write(directory)
        run.files += 1
        run.bytes += chunk.bytes
        if run.copied_from < 0:
            run.copied_from = chunk.first
        run.copied_to = chunk.last
        generation = 0

    try:
        async for batch in client.read_batches(
            p,
            start,
            stop,
            batch_records=settings.batch_records,
            # Chunks end between range reads: reads no bigger than a chunk keep them near
            # their size.
            batch_bytes=min(settings.batch_bytes, settings.chunk_bytes),
            in_flight=settings.in_flight,
        ):
            if writer is None:
                writer = ChunkWriter(directory, p, batch.first_txid)
            writer.append(batch)
            buf = batch.buf
            for _, pos, _ in batch.spans:  # the generation: the same place in both formats
                generation = max(generation, WIRE_RECORD_HEAD.unpack_from(buf, pos)[2])
            if writer.bytes >= settings.chunk_bytes:
                seal()
        if writer is not None:
            seal()
    finally:
        if writer is not None:
            writer.abort()
    if manifest.partitions[p].high_water_mark != stop:
        raise BackupError(
            f"partition {p}: the range read ended at {manifest.partitions[p].high_water_mark}, "
            f"expected {stop}"
        )
