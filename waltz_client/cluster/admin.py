"""CreateCluster and the everyday metadata operations, as library calls.

The CLI (``waltz cluster ...``) and the operator both call these. Every
read-modify-write is a compare-and-set on the znode version, retried on a
lost race; changes spanning several znodes are one ZooKeeper transaction.
A refused operation raises ClusterError and writes nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    NotEmptyError,
)

from waltz_client.cluster.partition_ranges import format_partition_ranges

from .access import AccessPolicy
from .client_ids import new_client_ids
from .errors import ClusterError
from .metadata import (
    ClusterParams,
    MetadataError,
    Ownership,
    PartitionMetadata,
    ReplicaAssignment,
    ServerRegistration,
    validate_storage_address,
)
from .paths import ClusterPaths
from .placement import assign_replicas, place_new_partitions
from .replica_safety import replica_change_problem, still_serving, writing_members
from .retention import RetentionPolicy

CAS_ATTEMPTS = 20

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class _Codec(Protocol[T_co]):
    """A metadata class: ``decode`` makes one of it from a znode's data."""

    def decode(self, data: bytes, /) -> T_co: ...


class _Policy(Protocol):
    """A policy document (AccessPolicy, RetentionPolicy)."""

    def encode(self) -> bytes: ...


P = TypeVar("P", bound=_Policy)


@dataclass
class CreateResult:
    created: bool
    params: ClusterParams
    assignment: ReplicaAssignment


@dataclass
class ClusterState:
    """Everything `waltz cluster show` prints, read at one moment (not atomically)."""

    root: str
    params: ClusterParams
    assignment: ReplicaAssignment
    partitions: dict[int, PartitionMetadata]
    servers: dict[str, ServerRegistration]
    ownership: Ownership
    problems: list[str] = field(default_factory=list)

    def members(self, partition_id: int) -> list[str]:
        """The replicas of the partition's last writing session (its members)."""
        meta = self.partitions.get(partition_id)
        return sorted(writing_members(meta)) if meta is not None else []

    def still_serving(self) -> dict[str, list[int]]:
        """Storage nodes keeping partitions removed from them for a vote (see
        ``replica_safety.still_serving``): do not delete their data yet."""
        assignment = {p: self.assignment.replicas_of(p) for p in range(self.params.num_partitions)}
        return still_serving(assignment, self.partitions)


def _decode(path: str, data: bytes, codec: _Codec[T]) -> T:
    try:
        return codec.decode(data)
    except MetadataError as e:
        raise ClusterError(f"{path}: {e}") from None


def read_params(zk: KazooClient, root: str) -> ClusterParams:
    paths = ClusterPaths.of(root)
    try:
        data, _ = zk.get(paths.cluster)
    except NoNodeError:
        raise ClusterError(
            f"no Waltz cluster at {paths.root} (no {paths.cluster} node); "
            f"create one with `waltz cluster create`"
        ) from None
    return _decode(paths.cluster, data, ClusterParams)


def read_assignment(zk: KazooClient, root: str) -> tuple[ReplicaAssignment, int]:
    """The replica assignment and its znode version (for compare-and-set)."""
    paths = ClusterPaths.of(root)
    try:
        data, stat = zk.get(paths.assignment)
    except NoNodeError:
        raise ClusterError(f"{paths.assignment} is missing: the cluster is incomplete") from None
    return _decode(paths.assignment, data, ReplicaAssignment), stat.version


def create_cluster(
    zk: KazooClient,
    root: str,
    name: str,
    num_partitions: int,
    num_replicas: int,
    storages: list[str],
    groups: dict[str, int] | None = None,
    key: uuid.UUID | None = None,
) -> CreateResult:
    """Write key, parameters, replica assignment and per-partition metadata in one transaction.

    Idempotent: the same arguments again change nothing (``created`` is False).
    Conflicting arguments change nothing and raise ClusterError listing what differs.
    """
    paths = ClusterPaths.of(root)
    if not name.strip():
        raise ClusterError("the cluster name must not be empty")
    params = ClusterParams(name, key or uuid.uuid4(), num_partitions, num_replicas)
    if zk.exists(paths.cluster):  # say what differs before judging the arguments
        return _same_cluster(zk, root, params, set(storages), key_given=key is not None)
    try:
        for s in storages:
            validate_storage_address(s)
        assignment = assign_replicas(storages, num_partitions, num_replicas, groups)
    except ValueError as e:
        raise ClusterError(str(e)) from None
    for _ in range(CAS_ATTEMPTS):
        if zk.exists(paths.cluster):
            return _same_cluster(zk, root, params, set(storages), key_given=key is not None)
        parent = paths.root.rsplit("/", 1)[0]
        if parent:
            zk.ensure_path(parent)
        txn = zk.transaction()
        if not zk.exists(paths.root):
            txn.create(paths.root, b"")
        txn.create(paths.cluster, params.encode())
        txn.create(paths.store, b"")
        txn.create(paths.assignment, assignment.encode())
        txn.create(paths.partitions, b"")
        for p in range(num_partitions):
            txn.create(paths.partition(p), PartitionMetadata().encode())
        txn.create(paths.servers, b"")
        txn.create(
            paths.ownership, Ownership({p: (None, 0) for p in range(num_partitions)}).encode()
        )
        txn.create(paths.client_ids, b"")  # the cluster's ACL: only servers draw IDs
        try:
            results = txn.commit()
        except ConnectionLoss:
            raise ClusterError(
                f"creating the cluster at {paths.root} failed: ZooKeeper dropped the connection "
                f"(a transaction of {num_partitions} partitions may exceed its request size "
                f"limit, jute.maxbuffer)"
            ) from None
        failures = [r for r in results if isinstance(r, Exception)]
        if not failures:
            return CreateResult(True, params, assignment)
        if not zk.exists(paths.cluster):
            in_the_way = [
                path
                for path in (
                    paths.store,
                    paths.assignment,
                    paths.partitions,
                    paths.servers,
                    paths.ownership,
                    paths.client_ids,
                    *(paths.partition(p) for p in range(num_partitions)),
                )
                if zk.exists(path)
            ]
            if in_the_way:
                raise ClusterError(
                    f"cannot create the cluster at {paths.root}: {', '.join(in_the_way[:5])} "
                    f"already exist without a cluster node (leftovers? nothing was changed)"
                )
        if not any(isinstance(r, NodeExistsError) for r in failures):
            raise ClusterError(f"creating the cluster at {paths.root} failed: {failures[0]!r}")
        # Someone created nodes concurrently: compare with what is there now.
    raise ClusterError(f"could not create the cluster at {paths.root}: too many concurrent changes")


@dataclass(frozen=True)
class GrowResult:
    grown: bool  # False: the cluster already had that many partitions
    before: int
    params: ClusterParams  # as it is now
    assignment: ReplicaAssignment


def add_partitions(zk: KazooClient, root: str, num_partitions: int) -> GrowResult:
    """Grow the cluster to ``num_partitions`` partitions, in one ZooKeeper transaction:
    the count in ``<root>/cluster``, the new partitions' replicas in the assignment (the
    placement rules of creation), their metadata nodes, and their (unowned) entries in
    the ownership. Partitions never shrink: a smaller count is refused; the same count
    changes nothing. Every node it changes is compared-and-set, so a concurrent change
    (a server moving ownership, ``add-storage``) makes it read and decide again."""
    paths = ClusterPaths.of(root)
    for _ in range(CAS_ATTEMPTS):
        try:
            data, stat = zk.get(paths.cluster)
        except NoNodeError:
            read_params(zk, root)  # raises ClusterError, naming what is missing
            raise
        params = _decode(paths.cluster, data, ClusterParams)
        before = params.num_partitions
        if num_partitions < before:
            raise ClusterError(
                f"the cluster at {paths.root} has {before} partitions: partitions are never "
                f"removed, so it cannot have {num_partitions} (nothing was changed)"
            )
        assignment, assignment_version = read_assignment(zk, root)
        if num_partitions == before:
            return GrowResult(False, before, params, assignment)
        try:
            grown = place_new_partitions(assignment, before, num_partitions, params.num_replicas)
        except ValueError as e:
            raise ClusterError(
                f"cannot place the new partitions: {e} (nothing was changed)"
            ) from None
        try:
            owners_data, owners_stat = zk.get(paths.ownership)
        except NoNodeError:
            raise ClusterError(f"{paths.ownership} is missing: the cluster is incomplete") from None
        owners = _decode(paths.ownership, owners_data, Ownership)
        new_owners = Ownership(
            {**owners.partitions, **{p: (None, 0) for p in range(before, num_partitions)}}
        )
        new_params = replace(params, num_partitions=num_partitions)
        txn = zk.transaction()
        txn.set_data(paths.cluster, new_params.encode(), version=stat.version)
        txn.set_data(paths.assignment, grown.encode(), version=assignment_version)
        txn.set_data(paths.ownership, new_owners.encode(), version=owners_stat.version)
        for p in range(before, num_partitions):
            txn.create(paths.partition(p), PartitionMetadata().encode())
        try:
            results = txn.commit()
        except ConnectionLoss:
            raise ClusterError(
                f"growing the cluster at {paths.root} to {num_partitions} partitions failed: "
                f"ZooKeeper dropped the connection (the transaction may exceed its request "
                f"size limit, jute.maxbuffer: grow in smaller steps)"
            ) from None
        failures = [r for r in results if isinstance(r, Exception)]
        if not failures:
            return GrowResult(True, before, new_params, grown)
        leftovers = [
            paths.partition(p)
            for p, r in zip(range(before, num_partitions), results[3:], strict=True)
            if isinstance(r, NodeExistsError)
        ]
        if leftovers and zk.get(paths.cluster)[1].version == stat.version:
            raise ClusterError(
                f"cannot grow the cluster at {paths.root}: {', '.join(leftovers[:5])} already "
                f"exist beyond its {before} partitions (leftovers? nothing was changed)"
            )
        # A node changed under us (a server moved ownership, say): read and decide again.
    raise ClusterError(f"could not grow the cluster at {paths.root}: too many concurrent changes")


def _same_cluster(
    zk: KazooClient,
    root: str,
    wanted: ClusterParams,
    wanted_storages: set[str],
    key_given: bool,
) -> CreateResult:
    existing = read_params(zk, root)
    assignment, _ = read_assignment(zk, root)
    diffs = []
    for label, have, want in (
        ("name", existing.name, wanted.name),
        ("partitions", existing.num_partitions, wanted.num_partitions),
        ("replicas", existing.num_replicas, wanted.num_replicas),
    ):
        if have != want:
            diffs.append(f"{label} is {have}, requested {want}")
    if key_given and existing.key != wanted.key:
        diffs.append(f"key is {existing.key}, requested {wanted.key}")
    if set(assignment.storages) != wanted_storages:
        diffs.append(
            f"storage nodes are {','.join(sorted(assignment.storages))}, requested "
            f"{','.join(sorted(wanted_storages))}"
        )
    if diffs:
        raise ClusterError(
            f"a different cluster already exists at {ClusterPaths.of(root).root}: "
            + "; ".join(diffs)
            + " (nothing was changed)"
        )
    return CreateResult(False, existing, assignment)


def read_cluster(zk: KazooClient, root: str) -> ClusterState:
    paths = ClusterPaths.of(root)
    params = read_params(zk, root)
    assignment, _ = read_assignment(zk, root)
    problems = assignment.problems(params.num_partitions, params.num_replicas)
    partitions = {}
    for p in range(params.num_partitions):
        try:
            data, _ = zk.get(paths.partition(p))
            partitions[p] = _decode(paths.partition(p), data, PartitionMetadata)
        except NoNodeError:
            problems.append(f"partition {p} has no metadata node")
        except ClusterError as e:
            problems.append(str(e))
    servers = {}
    for child in sorted(zk.get_children(paths.servers)):
        try:
            data, _ = zk.get(paths.server(child))
            servers[child] = _decode(paths.server(child), data, ServerRegistration)
        except NoNodeError:  # the server went away while we looked
            continue
        except ClusterError as e:
            problems.append(str(e))
    try:
        data, _ = zk.get(paths.ownership)
        ownership = _decode(paths.ownership, data, Ownership)
    except NoNodeError:
        ownership = Ownership({})
        problems.append(f"{paths.ownership} is missing")
    return ClusterState(paths.root, params, assignment, partitions, servers, ownership, problems)


def update_assignment(
    zk: KazooClient,
    root: str,
    change: Callable[[ReplicaAssignment, ClusterParams], ReplicaAssignment],
) -> ReplicaAssignment:
    """Compare-and-set the replica assignment: ``change`` may raise ClusterError to refuse.

    A change to a partition's replica set is refused if it could leave the partition
    unable to recover (``replica_safety``). That check reads the partition's metadata, so
    the write is one ZooKeeper transaction that also checks those znodes' versions: a
    server recording a new session meanwhile makes us read and decide again."""
    paths = ClusterPaths.of(root)
    params = read_params(zk, root)
    for _ in range(CAS_ATTEMPTS):
        current, version = read_assignment(zk, root)
        new = change(current, params)
        if new == current:
            return current
        checked = _check_replica_changes(zk, paths, current, new, params.num_partitions)
        txn = zk.transaction()
        for path, metadata_version in checked.items():
            txn.check(path, metadata_version)
        txn.set_data(paths.assignment, new.encode(), version=version)
        if not any(isinstance(r, Exception) for r in txn.commit()):
            return new
        # The assignment or a partition's metadata changed under us: decide again.
    raise ClusterError("the replica assignment kept changing; try again")


def _check_replica_changes(
    zk: KazooClient,
    paths: ClusterPaths,
    current: ReplicaAssignment,
    new: ReplicaAssignment,
    num_partitions: int,
) -> dict[str, int]:
    """Refuse (ClusterError) a change that could leave a partition unable to recover; the
    metadata znodes read, with their versions."""
    versions: dict[str, int] = {}
    problems = []
    for p in range(num_partitions):
        replicas = set(new.replicas_of(p))
        if replicas == set(current.replicas_of(p)):
            continue
        path = paths.partition(p)
        try:
            data, stat = zk.get(path)
        except NoNodeError:
            continue  # no session has run: nothing to lose
        versions[path] = stat.version
        problem = replica_change_problem(p, _decode(path, data, PartitionMetadata), replicas)
        if problem is not None:
            problems.append(problem)
    if problems:
        raise ClusterError("refusing to change the replica assignment: " + "; ".join(problems))
    return versions


def _check_replicas(new: ReplicaAssignment, params: ClusterParams, action: str) -> None:
    short = [
        p for p in range(params.num_partitions) if len(new.replicas_of(p)) < params.num_replicas
    ]
    if short:
        raise ClusterError(
            f"refusing to {action}: partitions {format_partition_ranges(short)} would have "
            f"fewer than {params.num_replicas} replicas (assign them elsewhere first)"
        )


def add_storage(
    zk: KazooClient, root: str, address: str, group: int = 0, partitions: set[int] | None = None
) -> ReplicaAssignment:
    try:
        validate_storage_address(address)
    except ValueError as e:
        raise ClusterError(str(e)) from None

    def change(current: ReplicaAssignment, params: ClusterParams) -> ReplicaAssignment:
        if address in current.storages:
            raise ClusterError(f"storage node {address} is already in the cluster")
        _check_range(partitions or set(), params)
        return ReplicaAssignment(
            {**current.storages, address: frozenset(partitions or ())},
            {**current.groups, address: group},
        )

    return update_assignment(zk, root, change)


def remove_storage(zk: KazooClient, root: str, address: str) -> ReplicaAssignment:
    def change(current: ReplicaAssignment, params: ClusterParams) -> ReplicaAssignment:
        if address not in current.storages:
            raise ClusterError(
                f"storage node {address} is not in the cluster "
                f"(nodes: {', '.join(sorted(current.storages)) or 'none'})"
            )
        new = ReplicaAssignment(
            {s: p for s, p in current.storages.items() if s != address},
            {s: g for s, g in current.groups.items() if s != address},
        )
        _check_replicas(new, params, f"remove {address}")
        return new

    return update_assignment(zk, root, change)


def set_storage_groups(zk: KazooClient, root: str, groups: dict[str, int]) -> ReplicaAssignment:
    """Give storage nodes their failure domains (node -> group). Only the labels change:
    no replica moves, so the majority rule is untouched; a rebalance moves replicas
    afterwards where a partition's replicas share a group."""

    def change(current: ReplicaAssignment, params: ClusterParams) -> ReplicaAssignment:
        unknown = sorted(set(groups) - set(current.storages))
        if unknown:
            raise ClusterError(f"storage nodes not in the cluster: {', '.join(unknown)}")
        bad = sorted(s for s, g in groups.items() if g < 0)
        if bad:
            raise ClusterError(f"a group is a number from 0: {', '.join(bad)}")
        return ReplicaAssignment(dict(current.storages), {**current.groups, **groups})

    return update_assignment(zk, root, change)


def _check_range(partitions: set[int], params: ClusterParams) -> None:
    bad = sorted(p for p in partitions if not 0 <= p < params.num_partitions)
    if bad:
        raise ClusterError(f"partitions {bad} are outside 0..{params.num_partitions - 1}")


def assign_partitions(
    zk: KazooClient, root: str, address: str, partitions: set[int]
) -> ReplicaAssignment:
    def change(current: ReplicaAssignment, params: ClusterParams) -> ReplicaAssignment:
        if address not in current.storages:
            raise ClusterError(f"storage node {address} is not in the cluster; add it first")
        _check_range(partitions, params)
        return ReplicaAssignment(
            {**current.storages, address: current.storages[address] | frozenset(partitions)},
            current.groups,
        )

    return update_assignment(zk, root, change)


def unassign_partitions(
    zk: KazooClient, root: str, address: str, partitions: set[int]
) -> ReplicaAssignment:
    def change(current: ReplicaAssignment, params: ClusterParams) -> ReplicaAssignment:
        if address not in current.storages:
            raise ClusterError(f"storage node {address} is not in the cluster")
        _check_range(partitions, params)
        new = ReplicaAssignment(
            {**current.storages, address: current.storages[address] - frozenset(partitions)},
            current.groups,
        )
        _check_replicas(new, params, f"unassign those partitions from {address}")
        return new

    return update_assignment(zk, root, change)


def read_access(zk: KazooClient, root: str) -> tuple[AccessPolicy, int]:
    """The access policy and its znode version (-1: none yet, which is an empty policy)."""
    paths = ClusterPaths.of(root)
    try:
        data, stat = zk.get(paths.access)
    except NoNodeError:
        return AccessPolicy(), -1
    return _decode(paths.access, data, AccessPolicy), stat.version


def update_access(
    zk: KazooClient, root: str, change: Callable[[AccessPolicy], AccessPolicy]
) -> AccessPolicy:
    """Compare-and-set the access policy (created on first use)."""
    params = read_params(zk, root)
    return update_document(
        zk,
        ClusterPaths.of(root).access,
        "the access policy",
        lambda: read_access(zk, root),
        change,
        lambda new: AccessPolicy.decode(new.encode(), params.num_partitions),
    )


def read_retention(zk: KazooClient, root: str) -> tuple[RetentionPolicy, int]:
    """The retention policy and its znode version (-1: none yet: keep everything)."""
    paths = ClusterPaths.of(root)
    params = read_params(zk, root)
    try:
        data, stat = zk.get(paths.retention)
    except NoNodeError:
        return RetentionPolicy(), -1
    try:
        return RetentionPolicy.decode(data, params.num_partitions), stat.version
    except MetadataError as e:
        raise ClusterError(f"{paths.retention}: {e}") from None


def update_retention(
    zk: KazooClient, root: str, change: Callable[[RetentionPolicy], RetentionPolicy]
) -> RetentionPolicy:
    """Compare-and-set the retention policy (created on first use)."""
    params = read_params(zk, root)
    return update_document(
        zk,
        ClusterPaths.of(root).retention,
        "the retention policy",
        lambda: read_retention(zk, root),
        change,
        lambda new: RetentionPolicy.decode(new.encode(), params.num_partitions),
    )


def update_document(
    zk: KazooClient,
    path: str,
    what: str,
    read: Callable[[], tuple[P, int]],
    change: Callable[[P], P],
    check: Callable[[P], object],
) -> P:
    """Compare-and-set a document (a policy, the replacements record): read, change,
    check, write (created on first use); again if it changed meanwhile."""
    for _ in range(CAS_ATTEMPTS):
        current, version = read()
        new = change(current)
        # Checked as every server will read it: a policy they refuse must not be written.
        check(new)
        if new == current:
            return current
        try:
            if version < 0:
                zk.create(path, new.encode())
            else:
                zk.set(path, new.encode(), version=version)
            return new
        except (NodeExistsError, BadVersionError):
            continue  # changed under us: decide again
    raise ClusterError(f"{what} kept changing; try again")


def delete_cluster(zk: KazooClient, root: str, confirm_name: str, force: bool = False) -> None:
    """Delete every node of the cluster. Refused unless ``confirm_name`` is the cluster's name,
    and while servers are registered unless ``force``."""
    paths = ClusterPaths.of(root)
    params = read_params(zk, root)
    if confirm_name != params.name:
        raise ClusterError(
            f"refusing to delete: the cluster at {paths.root} is named "
            f"{params.name!r}; confirm with that name"
        )
    live = zk.get_children(paths.servers) if zk.exists(paths.servers) else []
    if live and not force:
        raise ClusterError(
            f"refusing to delete: servers {', '.join(sorted(live))} are still "
            f"registered (stop them, or use --force)"
        )
    try:
        zk.delete(paths.root, recursive=True)
    except NotEmptyError:  # a node appeared during the delete
        zk.delete(paths.root, recursive=True)


def new_client_id(zk: KazooClient, root: str) -> int:
    """A cluster-wide unique number from the client-ID counter (the sequence number of a
    deleted sequential node), bound to nobody. Servers allocate clients' IDs
    (``client_ids.allocate_client_id``); under a cluster's ACL only a writer may draw."""
    return new_client_ids(zk, root)[0]
