"""The server's view of ZooKeeper: registration, partition ownership, partition metadata.

Every server registers an ephemeral node; the lowest live server ID
rebalances ownership (``ownership.assign_owners``) by compare-and-set
whenever the set of live servers changes; a rebalance that fails is retried
with capped exponential backoff until it succeeds, a newer membership change
supersedes it, or this server is no longer the assigner. Every server follows the
ownership node and serves exactly the partitions it names for it. When the
ZooKeeper session is lost, the server stops serving at once: another server
may already own its partitions. kazoo runs in its own thread; everything it
reports is handed to the event loop with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar, TypeVarTuple

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError
from kazoo.protocol.states import ZnodeStat

from waltz_client.cluster.access import DENY_ALL, AccessPolicy
from waltz_client.cluster.acl import ZkCredential, adopt_cluster_acl, readopt_open_acl
from waltz_client.cluster.admin import read_assignment, read_params
from waltz_client.cluster.errors import ClusterError
from waltz_client.cluster.metadata import (
    ClusterParams,
    MetadataError,
    Ownership,
    PartitionMetadata,
    ReplicaAssignment,
    ServerRegistration,
)
from waltz_client.cluster.paths import ClusterPaths
from waltz_client.cluster.retention import RetentionPolicy
from waltz_client.cluster.zk import close, connect
from waltz_client.cluster.zk_async import completed
from waltz_client.runtime.tasks import spawn, wait_for
from waltz_client.runtime.tls import TlsFiles

from .metadata_writes import MetadataWrite, MetadataWriter
from .ownership import assign_owners, assigner, owned_by, rebalance_retry_delay
from .recovery_manager import AssignmentChanged, MetadataConflict, Superseded

log = logging.getLogger(__name__)

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


def _describe(e: BaseException) -> str:
    """The error's type and message: kazoo's errors (NoAuthError(), ...) often have no
    message, and a bare empty string in the log would hide what failed."""
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


class ServerCoordinator:
    def __init__(
        self,
        connect_string: str,
        root: str,
        registration: ServerRegistration,
        *,
        session_timeout: float = 10.0,
        credential: ZkCredential | None = None,
        tls: TlsFiles | None = None,
        on_ownership: Callable[[dict[int, int]], None] = lambda owned: None,
        on_assignment: Callable[[ReplicaAssignment], None] = lambda a: None,
        on_session_lost: Callable[[], None] = lambda: None,
    ) -> None:
        self.connect_string = connect_string
        self.paths = ClusterPaths.of(root)
        self.registration = registration
        self.session_timeout = session_timeout
        self.credential = credential  # writes the metadata under the cluster's ACL
        self.tls = tls  # reach ZooKeeper's TLS port
        self._on_ownership = on_ownership
        self._on_assignment = on_assignment
        self._on_session_lost = on_session_lost
        self._zk: KazooClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.params: ClusterParams | None = None
        self.assignment: ReplicaAssignment | None = None
        self.assignment_version = -1  # its znode's version, checked by metadata writes
        self.metadata_writes = MetadataWriter(lambda: self.zk, self.paths.assignment)
        self.connected = False
        self.live_servers: list[str] = []
        # Who may read or append which partition: nobody until the policy is first read
        # (its watch reports before ownership's, so no partition is served before).
        self.access: AccessPolicy = DENY_ALL
        # How much of each partition to keep: everything until the policy is read.
        self.retention = RetentionPolicy()
        # One rebalance task at a time. Every request sets the event; the task clears it
        # as an attempt starts, so requests during an attempt or a backoff coalesce.
        self._rebalance_task: asyncio.Task[None] | None = None
        self._rebalance_wanted = asyncio.Event()
        self._reconnect_task: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()  # policy re-reads after a growth
        self._stopping = False

    def set_handlers(
        self,
        on_ownership: Callable[[dict[int, int]], None],
        on_assignment: Callable[[ReplicaAssignment], None],
        on_session_lost: Callable[[], None],
    ) -> None:
        self._on_ownership = on_ownership
        self._on_assignment = on_assignment
        self._on_session_lost = on_session_lost

    @property
    def zk(self) -> KazooClient:
        assert self._zk is not None, "not connected"
        return self._zk

    async def _run(self, fn: Callable[[*Ts], T], *args: *Ts) -> T:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    async def blocking(self, fn: Callable[[KazooClient, str], T]) -> T:
        """``fn(zk, root)`` (an admin library call) in a worker thread."""
        return await self._run(fn, self.zk, self.paths.root)

    async def start(
        self,
        retry_every: float = 2.0,
        before_registering: Callable[[ReplicaAssignment], Awaitable[None]] | None = None,
    ) -> None:
        """Connect, wait for the cluster to exist, register and start following.
        ``before_registering``: given the replica assignment, readies the server before
        it registers (the assigner gives a registered server partitions at once)."""
        self._loop = asyncio.get_running_loop()
        while self._zk is None:
            try:
                self._zk = await self._run(
                    lambda: connect(
                        self.connect_string,
                        timeout=10.0,
                        session_timeout=self.session_timeout,
                        credential=self.credential,
                        tls=self.tls,
                    )
                )
            except ClusterError as e:
                log.warning("%s; retrying in %g s", e, retry_every)
                await asyncio.sleep(retry_every)
        while self.params is None:
            try:
                self.params = await self._run(read_params, self.zk, self.paths.root)
            except (ClusterError, MetadataError) as e:
                log.warning("waiting for the cluster: %s", e)
                await asyncio.sleep(retry_every)
        # Nodes we create (registrations, client bindings) get the cluster's ACL.
        await self._run(adopt_cluster_acl, self.zk, self.paths.root)
        if before_registering is not None:
            try:
                assignment, _ = await self._run(read_assignment, self.zk, self.paths.root)
            except (ClusterError, MetadataError, KazooException) as e:
                log.warning("not readying ahead: the replica assignment: %s", _describe(e))
            else:
                await before_registering(assignment)
        self.zk.add_listener(self._state_changed)
        await self._run(self._register)
        self.connected = True
        self.zk.DataWatch(self.paths.cluster, self._cluster_changed)
        self.zk.DataWatch(self.paths.access, self._access_changed)
        self.zk.DataWatch(self.paths.retention, self._retention_changed)
        self.zk.DataWatch(self.paths.assignment, self._assignment_changed)
        self.zk.ChildrenWatch(self.paths.servers, self._servers_changed)
        self.zk.DataWatch(self.paths.ownership, self._ownership_changed)

    async def stop(self) -> None:
        self._stopping = True  # no new rebalance or re-registration from here on
        for task in (self._rebalance_task, self._reconnect_task):
            if task is not None and not task.done():
                task.cancel()
                # asyncio.wait neither raises the task's cancellation nor hides our own.
                await asyncio.wait({task})
        if self._zk is not None:
            zk, self._zk = self._zk, None
            await self._run(close, zk)

    # --- kazoo thread -> loop -----------------------------------------------------------

    def _post(self, fn: Callable[[*Ts], object], *args: *Ts) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(fn, *args)

    def _state_changed(self, state: str) -> None:
        if state == KazooState.LOST:
            self.connected = False
            if self._stopping:  # our own close at shutdown ends the session: expected
                log.info("ZooKeeper session closed")
                return
            log.error("ZooKeeper session lost: stopping every partition")
            self._post(self._on_session_lost)
        elif state == KazooState.SUSPENDED:
            log.warning("ZooKeeper connection suspended")
        elif state == KazooState.CONNECTED and not self.connected:
            self._post(self._reconnected)

    def _reconnected(self) -> None:
        async def again() -> None:
            try:
                await self._run(self._register)
                self.connected = True
                self._request_rebalance()
                data, _ = await self._run(self.zk.get, self.paths.ownership)
                self._ownership_changed(data, None)
            except Exception as e:  # the next state change retries
                log.warning("re-registering after a new ZooKeeper session failed: %s", _describe(e))

        if not self._stopping:
            # Kept so that the task is not garbage-collected midway and stop() can end it.
            self._reconnect_task = asyncio.get_running_loop().create_task(again())

    def _register(self) -> None:
        path = self.paths.server(self.registration.server_id)
        data = self.registration.encode()
        readopt_open_acl(self.zk, self.paths.root)  # the cluster may have been secured since
        self.zk.ensure_path(self.paths.servers)
        try:
            self.zk.create(path, data, ephemeral=True)
        except NodeExistsError:
            # Our previous process (or session) left it; it expires with that session.
            log.warning("replacing the stale registration %s", path)
            with contextlib.suppress(NoNodeError):
                self.zk.delete(path)
            self.zk.create(path, data, ephemeral=True)

    def _cluster_changed(self, data: bytes | None, stat: ZnodeStat | None) -> None:
        if data is None:
            return
        try:
            params = ClusterParams.decode(data)
        except MetadataError as e:
            log.error("ignoring an unreadable cluster node: %s", e)
            return
        self._post(self._set_params, params)

    def _set_params(self, params: ClusterParams) -> None:
        """Only a growth of the partitions is taken: the new ones get owners."""
        current = self.params
        assert current is not None
        try:
            grown = current.grown_to(params)
        except MetadataError as e:
            log.error("ignoring the cluster node: %s", e)
            return
        if grown is None:
            return
        log.info("the cluster grew from %d to %d partitions", current.num_partitions, grown)
        self.params = params
        self._request_rebalance()
        # A policy naming a new partition, read before the count rose, was refused as
        # unreadable: read both again against the new count.
        spawn(self._reread_policies(), self._background, "re-reading the policies", log)

    async def _reread_policies(self) -> None:
        for path, changed in (
            (self.paths.access, self._access_changed),
            (self.paths.retention, self._retention_changed),
        ):
            try:
                data, stat = await self._run(self.zk.get, path)
            except NoNodeError:
                continue
            changed(data, stat)

    def _access_changed(self, data: bytes | None, stat: ZnodeStat | None) -> None:
        if data is None:
            self._post(self._set_access, AccessPolicy(), "no access policy: partitions are open")
            return
        assert self.params is not None
        try:
            policy = AccessPolicy.decode(data, self.params.num_partitions)
        except MetadataError as e:
            # Refuse rather than guess: keep the last good policy (nobody, at start).
            log.error("ignoring an unreadable access policy (%s): %s", self.paths.access, e)
            return
        self._post(self._set_access, policy, "access policy: " + "; ".join(policy.describe()))

    def _retention_changed(self, data: bytes | None, stat: ZnodeStat | None) -> None:
        assert self.params is not None
        try:
            policy = (
                RetentionPolicy()
                if data is None
                else RetentionPolicy.decode(data, self.params.num_partitions)
            )
        except MetadataError as e:
            # Keep the last good policy: deleting on a guess cannot be undone.
            log.error("ignoring an unreadable retention policy (%s): %s", self.paths.retention, e)
            return
        self._post(self._set_retention, policy)

    def _set_retention(self, policy: RetentionPolicy) -> None:
        if policy != self.retention:
            log.info("retention policy: %s", "; ".join(policy.describe()))
        self.retention = policy

    def _set_access(self, policy: AccessPolicy, description: str) -> None:
        if policy != self.access:
            log.info("%s", description)
        self.access = policy

    def _assignment_changed(self, data: bytes | None, stat: ZnodeStat | None) -> None:
        if data is None:
            return
        try:
            assignment = ReplicaAssignment.decode(data)
        except MetadataError as e:
            log.error("ignoring an unreadable replica assignment: %s", e)
            return
        assert stat is not None  # kazoo passes one with the data
        self._post(self._set_assignment, assignment, stat.version)

    def _set_assignment(self, assignment: ReplicaAssignment, version: int) -> None:
        self.assignment = assignment
        self.assignment_version = version
        self._on_assignment(assignment)

    def _servers_changed(self, children: list[str]) -> None:
        self._post(self._servers_now, list(children))

    def _servers_now(self, children: list[str]) -> None:
        self.live_servers = sorted(children)
        self._request_rebalance()

    def _ownership_changed(self, data: bytes | None, stat: ZnodeStat | None) -> None:
        if data is None:
            return
        try:
            ownership = Ownership.decode(data)
        except MetadataError as e:
            log.error("ignoring an unreadable ownership node: %s", e)
            return
        self._post(self._owned_now, ownership)

    def _owned_now(self, ownership: Ownership) -> None:
        if self.connected:
            self._on_ownership(owned_by(ownership, self.registration.server_id))

    # --- the assigner -------------------------------------------------------------------

    def _request_rebalance(self) -> None:
        """Rebalance soon. A request while the rebalance task is attempting or backing off
        makes it attempt again at once, over the newest membership, with a fresh backoff."""
        if self._stopping:
            return
        self._rebalance_wanted.set()
        if self._rebalance_task is None or self._rebalance_task.done():
            task = asyncio.get_running_loop().create_task(self._rebalance_until_done())
            task.add_done_callback(self._rebalance_finished)
            self._rebalance_task = task

    async def _rebalance_until_done(self) -> None:
        failures = 0
        while self._rebalance_wanted.is_set():
            self._rebalance_wanted.clear()
            try:
                await self._run(self._rebalance_blocking)
            except Exception as e:
                failures += 1
                if not self._may_retry_rebalance():
                    # A new session or membership change requests a rebalance of its own.
                    log.warning(
                        "rebalancing partitions failed (%s); not retrying: no ZooKeeper "
                        "session, or this server is no longer the assigner",
                        _describe(e),
                    )
                    continue
                delay = rebalance_retry_delay(failures)
                log.warning(
                    "rebalancing partitions failed (%s); retrying in %g s", _describe(e), delay
                )
                try:
                    await wait_for(self._rebalance_wanted.wait(), delay)
                    failures = 0  # superseded by a newer request: start the backoff over
                except TimeoutError:
                    self._rebalance_wanted.set()
            else:
                failures = 0

    @property
    def is_assigner(self) -> bool:
        """This server rebalances ownership, sweeps client IDs and replaces lost storage
        nodes: the lowest live server ID, as far as this server knows."""
        return self.connected and assigner(self.live_servers) == self.registration.server_id

    def _may_retry_rebalance(self) -> bool:
        return not self._stopping and self.is_assigner

    def _rebalance_finished(self, task: asyncio.Task[None]) -> None:
        # The loop handles every Exception; anything reaching here is a bug worth a trace.
        if not task.cancelled() and (e := task.exception()) is not None:
            log.error("the rebalance task failed", exc_info=e)

    def _rebalance_blocking(self) -> None:
        assert self.params is not None
        while True:
            live = self.zk.get_children(self.paths.servers)
            if assigner(live) != self.registration.server_id:
                return
            # The count read now, not the one of the last watch event: the assigner must
            # never place fewer partitions than the cluster has.
            num_partitions = read_params(self.zk, self.paths.root).num_partitions
            data, stat = self.zk.get(self.paths.ownership)
            current = Ownership.decode(data)
            new = assign_owners(current, num_partitions, live)
            if new == current:
                return
            try:
                self.zk.set(self.paths.ownership, new.encode(), version=stat.version)
                log.info("partition ownership rebalanced over %s", ", ".join(sorted(live)))
                return
            except BadVersionError:
                continue

    # --- a planned stop -----------------------------------------------------------------

    async def hand_over(self) -> bool:
        """A planned stop (SIGTERM): give this server's partitions to the other live
        servers now, while it still serves them. One ZooKeeper transaction deletes this
        server's registration and writes the ownership without it (by compare-and-set), so
        its partitions' new owners and the clients learn of the move from one change,
        without waiting for this server's session to end and the assigner to notice. From
        here on this server neither rebalances nor registers again. False when there is
        nobody to hand over to, no session, or ZooKeeper did not answer in time: the stop
        then goes on as before (the session's end hands the partitions over)."""
        self._stopping = True
        if not self.connected:
            return False
        try:
            handed = await wait_for(self._run(self._hand_over_blocking), self.session_timeout)
        except Exception as e:
            log.warning("handing the partitions over failed: %s", _describe(e))
            return False
        return handed

    def _hand_over_blocking(self) -> bool:
        me, zk, timeout = self.registration.server_id, self.zk, self.session_timeout
        while True:
            # The live servers, the partition count and the ownership in one round trip
            # (kazoo sends a session's requests without waiting for each answer).
            children = zk.get_children_async(self.paths.servers)
            cluster = zk.get_async(self.paths.cluster)
            owned = zk.get_async(self.paths.ownership)
            others = [s for s in children.get(timeout=timeout) if s != me]
            if not others:
                log.info("no other server to hand the partitions over to")
                return False
            num_partitions = ClusterParams.decode(cluster.get(timeout=timeout)[0]).num_partitions
            data, stat = owned.get(timeout=timeout)
            new = assign_owners(Ownership.decode(data), num_partitions, others)
            transaction = zk.transaction()
            transaction.delete(self.paths.server(me))
            transaction.set_data(self.paths.ownership, new.encode(), stat.version)
            unregistered, written = transaction.commit()
            if isinstance(written, BadVersionError):
                continue  # the ownership changed meanwhile: over the newest (nothing applied)
            if isinstance(unregistered, Exception) or isinstance(written, Exception):
                raise MetadataConflict(f"handing over failed: {unregistered!r}, {written!r}")
            log.info("partitions handed over to %s", ", ".join(sorted(others)))
            return True

    # --- partition metadata (recovery_manager.MetadataStore) ----------------------------

    # Recovery reads and writes each partition's metadata: asynchronously (zk_async.py),
    # so that a server recovering many partitions at once has all their requests in
    # flight rather than one a worker thread.

    async def read(self, partition_id: int) -> tuple[PartitionMetadata, int]:
        data, stat = await completed(self.zk.get_async(self.paths.partition(partition_id)))
        return PartitionMetadata.decode(data), stat.version

    async def write(
        self,
        partition_id: int,
        metadata: PartitionMetadata,
        version: int,
        replicas: tuple[str, ...] | None = None,
    ) -> int:
        """Compare-and-set; with ``replicas``, only while the assignment still gives the
        partition exactly those (checked in the same transaction). The writes of one loop
        turn share a ZooKeeper multi (metadata_writes.py). Refused once this server is
        stopping: a recovery it started after handing its partitions over (a store
        session that ended meanwhile) would race the new owner's for the same metadata,
        and win it at times, making the new owner retry a second later."""
        if self._stopping:
            raise Superseded(
                f"partition {partition_id}: this server is stopping (its partitions go to "
                f"the others); it writes no more partition metadata"
            )
        checked: int | None = None
        if replicas is not None:
            assignment = self.assignment
            now = tuple(assignment.replicas_of(partition_id)) if assignment else ()
            if assignment is None or now != tuple(replicas):
                raise AssignmentChanged(
                    f"partition {partition_id} is now assigned {', '.join(now) or 'nothing'}"
                )
            checked = self.assignment_version
        path = self.paths.partition(partition_id)
        return await self.metadata_writes.write(
            MetadataWrite(partition_id, path, metadata.encode(), version, checked)
        )

    async def read_assignment(self) -> ReplicaAssignment:
        assignment, _ = await self._run(read_assignment, self.zk, self.paths.root)
        return assignment
