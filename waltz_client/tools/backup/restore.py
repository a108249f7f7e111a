"""``waltz restore PATH``: a new cluster holding a backup's transactions under the same IDs.

The restore checks every byte of the backup first and refuses a non-empty target
(a storage directory, or a ZooKeeper root that holds anything); only then does it
write. It writes, in order:

1. each storage node's directory, with the storage engine itself
   (``waltz_storage.restore``): the control file of a new cluster key, and for every
   partition the node holds (the placement ``waltz cluster create`` would choose) the
   records ``first..H`` of the backup, the ``log-start`` file when ``first`` > 0, and
   the partition's control struct as a store session's recovery leaves it: session 0,
   low-water mark and local low-water mark ``H``;
2. the cluster in ZooKeeper (CreateCluster with that key), then, in one transaction,
   every partition's metadata as session 0 left it, with every replica a member of
   session 0 (``(0, UNRESOLVED)``), the log start ``first``, and the ownership
   generations above every generation among the restored records.

To the first server's recovery the restored cluster then looks exactly like one whose
session 0 recovered every partition to ``H`` and wrote nothing since: each replica is a
member of the last writing session whose low-water mark it set (``MEMBER``, votes its
maximum ``H``), so any majority of replicas decides ``H``, and the new session starts
after it. Nothing is written to ZooKeeper until the storage directories are complete;
a failure removes what the restore wrote.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from waltz_client.cluster.admin import create_cluster, delete_cluster
from waltz_client.cluster.errors import ClusterError
from waltz_client.cluster.metadata import (
    UNRESOLVED,
    Ownership,
    PartitionMetadata,
    ReplicaAssignment,
    ReplicaState,
    validate_storage_address,
)
from waltz_client.cluster.paths import ClusterPaths
from waltz_client.cluster.placement import assign_replicas
from waltz_client.wire.records import RecordBatch

from .format import BackupError, ChunkFile, Manifest, read_chunk, verify_backup

if TYPE_CHECKING:
    from waltz_storage.restore import RestoredPartition

# The store session the restored metadata and control files record: the first session
# a server opens is the next one.
RESTORED_SESSION = 0


@dataclass(frozen=True)
class StorageTarget:
    """A storage node of the new cluster: the address it will serve on (its name in the
    replica assignment) and the directory it will be started with."""

    address: str
    directory: str
    group: int = 0

    @classmethod
    def parse(cls, value: str) -> StorageTarget:
        """``HOST:PORT=DIR`` or ``HOST:PORT@GROUP=DIR``."""
        address, sep, directory = value.partition("=")
        if not sep or not directory:
            raise BackupError(f"--storage {value!r}: expected HOST:PORT=DIRECTORY")
        address, _, group = address.partition("@")
        if group and not group.isdigit():
            raise BackupError(f"--storage {value!r}: the group must be a number")
        try:
            validate_storage_address(address)
        except ValueError as e:
            raise BackupError(f"--storage {value!r}: {e}") from None
        return cls(address, os.path.abspath(directory), int(group or 0))


@dataclass
class RestorePlan:
    directory: str
    manifest: Manifest
    name: str
    key: uuid.UUID
    num_replicas: int
    targets: list[StorageTarget]
    assignment: ReplicaAssignment
    records: int = 0
    bytes: int = 0


@dataclass
class RestoreResult:
    plan: RestorePlan
    written: dict[str, list[int]] = field(default_factory=dict)  # directory -> partitions


def plan_restore(
    directory: str,
    targets: list[StorageTarget],
    *,
    name: str | None = None,
    num_replicas: int | None = None,
    key: uuid.UUID | None = None,
    progress: Callable[[str], None] = lambda message: None,
) -> RestorePlan:
    """Check the whole backup and the targets, and place the replicas; writes nothing.
    BackupError names the damaged file or the target in the way."""
    directory = os.path.abspath(directory)
    manifest = Manifest.read(directory)  # the cheap checks first, every byte last
    if not targets:
        raise BackupError("name the new cluster's storage nodes: --storage HOST:PORT=DIR")
    addresses = [t.address for t in targets]
    dupes = sorted({a for a in addresses if addresses.count(a) > 1})
    if dupes:
        raise BackupError(f"storage addresses given twice: {', '.join(dupes)}")
    folders = [os.path.realpath(t.directory) for t in targets]
    dupes = sorted({d for d in folders if folders.count(d) > 1})
    if dupes:
        raise BackupError(f"storage directories given twice: {', '.join(dupes)}")
    for t in targets:
        if os.path.exists(t.directory):
            if not os.path.isdir(t.directory):
                raise BackupError(f"{t.directory}: not a directory (nothing was restored)")
            if os.listdir(t.directory):
                raise BackupError(
                    f"{t.directory}: not empty: a restore writes only into empty storage "
                    f"directories (nothing was restored)"
                )
    replicas = num_replicas or manifest.source.num_replicas
    if replicas > len(targets):
        raise BackupError(
            f"{replicas} replicas per partition need at least {replicas} storage nodes, got "
            f"{len(targets)}"
            + (
                f" (the backed-up cluster had {replicas}; give more --storage, or --replicas "
                f"to restore with fewer)"
                if num_replicas is None
                else ""
            )
        )
    try:
        assignment = assign_replicas(
            addresses,
            manifest.source.num_partitions,
            replicas,
            {t.address: t.group for t in targets},
        )
    except ValueError as e:
        raise BackupError(str(e)) from None
    checked = verify_backup(directory, progress)
    manifest = checked.manifest
    return RestorePlan(
        directory,
        manifest,
        name or manifest.source.name,
        key or uuid.uuid4(),
        replicas,
        targets,
        assignment,
        checked.records,
        checked.bytes,
    )


def check_zookeeper_target(zk: KazooClient, root: str) -> None:
    """The new cluster's root must hold nothing (not even an empty node's children)."""
    paths = ClusterPaths.of(root)
    try:
        children = zk.get_children(paths.root)
    except NoNodeError:
        return
    if zk.exists(paths.cluster):
        raise BackupError(
            f"ZooKeeper already holds a cluster at {paths.root}: a restore creates a new "
            f"cluster; choose another --root (nothing was restored)"
        )
    if children:
        raise BackupError(
            f"ZooKeeper node {paths.root} is not empty ({', '.join(sorted(children)[:5])}): "
            f"choose another --root (nothing was restored)"
        )


def restore(
    plan: RestorePlan,
    zk: KazooClient,
    root: str,
    *,
    segment_bytes: int | None = None,
    progress: Callable[[str], None] = lambda message: None,
) -> RestoreResult:
    """Write the storage directories, then the cluster's metadata. On failure, what was
    written is removed again and BackupError (or the underlying error) is raised."""
    check_zookeeper_target(zk, root)
    created_dirs: list[tuple[str, bool]] = []  # (directory, created by us)
    result = RestoreResult(plan)
    cluster_created = False
    try:
        for t in plan.targets:
            existed = os.path.isdir(t.directory)
            os.makedirs(t.directory, exist_ok=True)
            created_dirs.append((t.directory, not existed))
        result.written = _write_storage(plan, segment_bytes, progress)
        check_zookeeper_target(zk, root)  # again: it may have changed meanwhile
        created = create_cluster(
            zk,
            root,
            plan.name,
            plan.manifest.source.num_partitions,
            plan.num_replicas,
            [t.address for t in plan.targets],
            {t.address: t.group for t in plan.targets},
            plan.key,
        )
        if not created.created:
            raise BackupError(f"a cluster appeared at {root} during the restore")
        cluster_created = True
        if created.assignment != plan.assignment:
            raise BackupError(
                "the replica assignment ZooKeeper got differs from the one the storage "
                "directories were written for"
            )
        _write_metadata(plan, zk, root)
        progress(f"created cluster {plan.name!r} at {ClusterPaths.of(root).root}")
    except BaseException:
        if cluster_created:
            with contextlib.suppress(Exception):
                delete_cluster(zk, root, plan.name, force=True)
        for directory, ours in created_dirs:
            _remove_written(directory, ours)
        raise
    return result


def _remove_written(directory: str, created: bool) -> None:
    """Undo a failed restore in a directory that was empty (or absent) before it."""
    if created:
        shutil.rmtree(directory, ignore_errors=True)
        return
    for entry in os.listdir(directory):
        path = os.path.join(directory, entry)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)


def _storage_restore() -> ModuleType:
    """The storage engine's restore (``waltz_storage.restore``), loaded only to write."""
    try:
        from waltz_storage import restore as storage_restore
    except ImportError as e:  # a client-only installation
        raise BackupError(
            f"restore writes storage directories with the storage engine (waltz_storage), "
            f"which this installation lacks: {e}"
        ) from None
    return storage_restore


def _write_storage(
    plan: RestorePlan, segment_bytes: int | None, progress: Callable[[str], None]
) -> dict[str, list[int]]:
    storage_restore = _storage_restore()
    manifest = plan.manifest
    holders = {
        p: [t for t in plan.targets if p in plan.assignment.storages[t.address]]
        for p in range(manifest.source.num_partitions)
    }

    def written(partition: RestoredPartition) -> None:
        p = partition.partition_id
        progress(
            f"partition {p}: {partition.first}..{partition.high_water_mark} written to "
            f"{', '.join(t.address for t in holders[p])}"
        )

    partitions = (
        storage_restore.RestoredPartition(
            p,
            manifest.partitions[p].first,
            manifest.partitions[p].high_water_mark,
            [t.directory for t in holders[p]],
            _batches(plan.directory, p, manifest.partitions[p].files),
        )
        for p in range(manifest.source.num_partitions)
    )
    try:
        return storage_restore.write_restored_nodes(
            [t.directory for t in plan.targets],
            plan.key,
            manifest.source.num_partitions,
            partitions,
            session=RESTORED_SESSION,
            segment_bytes=segment_bytes,
            on_written=written,
        )
    except storage_restore.RestoredLogMismatch as e:
        raise BackupError(str(e)) from None


def _batches(directory: str, partition: int, chunks: list[ChunkFile]) -> Iterator[RecordBatch]:
    """A partition's records from its chunk files, read (and checked again) as they go."""
    for chunk in chunks:
        yield from read_chunk(directory, partition, chunk)


def _write_metadata(plan: RestorePlan, zk: KazooClient, root: str) -> None:
    """Every partition's metadata as session 0 left it, and the ownership generations
    above the restored records' (one transaction, on the nodes CreateCluster made)."""
    paths = ClusterPaths.of(root)
    manifest = plan.manifest
    txn = zk.transaction()
    generations: dict[int, tuple[str | None, int]] = {}
    for p in range(manifest.source.num_partitions):
        b = manifest.partitions[p]
        generation = b.max_generation
        generations[p] = (None, generation)
        meta = PartitionMetadata(
            generation,
            RESTORED_SESSION,
            {
                address: ReplicaState(RESTORED_SESSION, UNRESOLVED)
                for address in plan.assignment.replicas_of(p)
            },
            b.first,
        )
        txn.set_data(paths.partition(p), meta.encode(), version=0)
    txn.set_data(paths.ownership, Ownership(generations).encode(), version=0)
    failures = [r for r in txn.commit() if isinstance(r, Exception)]
    if failures:
        raise ClusterError(
            f"writing the restored partition metadata at {paths.root} failed: {failures[0]!r} "
            f"(was a server already running against this root?)"
        )
