"""One simulated Waltz cluster, run from a seed: the real server code under faults.

What runs is the server's own code: ``Partition`` (with ``PartitionCore``), its
``StoreSession`` (with ``SessionCore``), recovery (``recovery_manager`` and the pure
vote), background catch-up, and the client connection handler; storage nodes run the
storage daemon's ``PartitionService`` on an in-memory disk; clients (``sim_client``) use
the real ``ServerConnection`` and decide with the client library's own
``ClientPartition`` and ``SubmissionRetries``. Only the outside is simulated: the clock
and the event loop (``sim_loop``), the network (``sim_net``), the disks
(``sim_storage``), ZooKeeper (the partition metadata by compare-and-set, server sessions
that expire) and the choice of partition owner with its generation (what the servers'
rebalance computes).

Faults, drawn from the seed: storage nodes crash (losing what they had not fsync'd) and
restart; links between a server and a storage node are cut and healed; the owning server
crashes, or is cut off from everything (a pause), or loses its ZooKeeper session, and the
partition moves to another server with a higher generation; client links are cut.
Clients append logical transactions, send again what a Mount, Flush or feed row settles
as lost (after the library's backoff, giving up after its ``max_retries``), and mount
again whenever the server tells them to.

After every event the world checks: no fork (a transaction ID delivered with two
different requests), no logical transaction committed twice, no request a client settled
as lost (or refused) ever committed, no gap on a feed, every acknowledged transaction on
a majority of replicas, every replica's log up to its local low-water mark equal to the
committed log, and each storage node accepting appends from non-decreasing sessions
only; and commit times never decrease along the committed log, though every server's
clock is off by up to seconds and steps back now and then (drawn from a second random
stream, so the faults a seed draws stay the same). At the end every fault heals, and
every replica must hold exactly the committed log, with every acknowledged transaction
in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import uuid
from dataclasses import replace

from sim_client import SimClient
from sim_loop import VirtualTimeLoop
from sim_net import SimNetwork, open_stream
from sim_storage import SimStorageNode

from waltz_client.cluster.metadata import PartitionMetadata
from waltz_client.cluster.replica_safety import replica_change_problem, still_needed
from waltz_client.wire.records import NO_TIMESTAMP, ReqId
from waltz_client.wire.storage_messages import (
    AppendRequest as StorageAppend,
)
from waltz_client.wire.storage_messages import (
    SetLowWaterMarkRequest,
    SuccessResponse,
    TruncateRequest,
)
from waltz_server.catch_up import CatchUpSettings
from waltz_server.connection import ClientConnectionHandler
from waltz_server.partition import Partition, PartitionSettings
from waltz_server.recovery_manager import AssignmentChanged, MetadataConflict, RecoveryContext
from waltz_server.storage_pool import StoragePool

PARTITION = 0
EPOCH = 1_800_000_000.0  # the simulated wall clock's start, in seconds since the epoch
STORAGES = ("s0", "s1", "s2", "s3")  # the partition's replica set is three or four of them
REPLICAS = 3
SERVERS = ("a", "b")
CLIENTS = ("c1", "c2")


class SimulationFailure(AssertionError):
    pass


class ZooKeeperUnavailable(Exception):
    """A metadata request from a server whose ZooKeeper session is gone or cut off."""


# --- ZooKeeper ------------------------------------------------------------------------


class SimZooKeeper:
    def __init__(self, world: World) -> None:
        self.world = world
        self.metadata = PartitionMetadata()
        self.version = 0


class MetadataClient:
    """A server's view of the partition metadata (``recovery_manager.MetadataStore``)."""

    def __init__(self, world: World, server: SimServer) -> None:
        self.world = world
        self.server = server

    async def _round_trip(self) -> None:
        await asyncio.sleep(self.world.net.delay())
        if not self.server.zk_ok():
            raise ZooKeeperUnavailable(f"server {self.server.name}: no ZooKeeper session")

    async def read(self, partition_id: int) -> tuple[PartitionMetadata, int]:
        await self._round_trip()
        zk = self.world.zk
        return zk.metadata, zk.version

    async def write(
        self,
        partition_id: int,
        metadata: PartitionMetadata,
        version: int,
        replicas: tuple[str, ...] | None = None,
    ) -> int:
        await self._round_trip()
        zk = self.world.zk
        if replicas is not None and tuple(replicas) != self.world.replica_addresses():
            # ZooKeeper's multi: the check of the assignment fails the whole write.
            raise AssignmentChanged(f"the replica assignment is {self.world.replica_addresses()}")
        if version != zk.version:
            raise MetadataConflict(f"version {version} is not {zk.version}")
        zk.metadata, zk.version = metadata, zk.version + 1
        self.world.retire()
        self.world.trace(
            f"zk: {self.server.name} wrote session {metadata.session_id} "
            f"gen {metadata.generation} replicas "
            + ",".join(
                f"{a}={r.session_id}/{r.closing_high_water_mark}"
                for a, r in sorted(metadata.replicas.items())
            )
        )
        return zk.version


# --- servers --------------------------------------------------------------------------


class SimServer:
    def __init__(self, world: World, name: str) -> None:
        self.world = world
        self.name = name
        self.address = f"{name}:1"
        self.partitions: dict[int, Partition] = {}
        self.connections: list[ClientConnectionHandler] = []
        self.up = True
        self.session_expired = False  # its ZooKeeper session ended; it has not noticed
        self.cut_since: float | None = None
        self.clock_error = world.clock_rng.uniform(-3.0, 3.0)  # seconds off the true time
        world.net.listen(name, self.address, self._new_connection)
        self.pool = self._new_pool()
        self.recovery_pool = self._new_pool()

    def _new_pool(self) -> StoragePool:
        """The server's shared storage connections (one set an incarnation)."""
        world = self.world
        return StoragePool(lambda host, port: open_stream(world.net, self.name, host, port))

    def zk_ok(self) -> bool:
        return self.up and not self.session_expired and self.cut_since is None

    def _new_connection(self) -> ClientConnectionHandler:
        conn = ClientConnectionHandler(
            self.partitions.get, 64 * 1024 * 1024, 1024 * 1024, self._closed
        )
        self.connections.append(conn)
        return conn

    def _closed(self, conn: ClientConnectionHandler) -> None:
        if conn in self.connections:
            self.connections.remove(conn)
        for p in conn.partitions_touched:
            partition = self.partitions.get(p)
            if partition is not None:
                partition.disconnect(conn)

    def wall_clock(self) -> int:
        """This server's wall clock in ms: the virtual time, off by its clock error."""
        return int((EPOCH + asyncio.get_running_loop().time() + self.clock_error) * 1000)

    def own(self, generation: int) -> None:
        world = self.world
        if world.clock_rng.random() < 0.3:  # NTP stepped the clock back meanwhile
            self.clock_error -= world.clock_rng.uniform(0.0, 2.0)
        context = RecoveryContext(
            partition_id=PARTITION,
            generation=generation,
            replicas=world.replica_addresses(),
            cluster_key=world.cluster_key,
            num_partitions=1,
            metadata=MetadataClient(world, self),
            connect_timeout=1.0,
            retry_delay=0.2,
            max_batch_bytes=64 * 1024,
            max_in_flight=4,
            catch_up=CatchUpSettings(inline_records=4, chunk_records=5, rate=0),
            open_connection=lambda host, port: open_stream(world.net, self.name, host, port),
            pool=self.pool,
            recovery_pool=self.recovery_pool,
        )
        partition = Partition(
            context,
            PartitionSettings(max_queue=200, feed_batch=50, probe_interval=0.5),
            self._superseded,
            wall_clock=self.wall_clock,
        )
        self.partitions[PARTITION] = partition
        partition.start()
        world.trace(f"server {self.name} serves the partition with generation {generation}")

    def _superseded(self, partition: Partition, reason: str) -> None:
        if self.partitions.get(partition.partition_id) is partition:
            del self.partitions[partition.partition_id]
            self.world.spawn(partition.stop(reason))

    async def stop_partitions(self, reason: str) -> None:
        for p in list(self.partitions):
            partition = self.partitions.pop(p)
            await partition.stop(reason)

    def crash(self) -> None:
        self.up = False
        self.world.net.node_down(self.name)
        for p in list(self.partitions):
            self.world.spawn(self.partitions.pop(p).stop("crashed"))
        self.connections.clear()
        self.world.spawn(self.pool.close())
        self.world.spawn(self.recovery_pool.close())
        self.pool = self._new_pool()
        self.recovery_pool = self._new_pool()


# --- the world ------------------------------------------------------------------------


class World:
    def __init__(self, seed: int, duration: float = 20.0) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.duration = duration
        self.lines: list[str] = []
        self.failure: str | None = None
        self.cluster_key = uuid.UUID(int=seed)
        # The servers' clock errors: their own stream, so the faults drawn stay the same.
        self.clock_rng = random.Random(seed ^ 0x5EED)
        self.net = SimNetwork(self.rng, self.trace)
        self.zk = SimZooKeeper(self)
        self.storages = [
            SimStorageNode(self.net, self.observe, s, f"{s}:1", self.cluster_key, [PARTITION], 1)
            for s in STORAGES
        ]
        self._last_session = {s: -1 for s in STORAGES}
        self.assignment = set(STORAGES[:REPLICAS])  # storage nodes assigned the partition
        self.storages[-1].close_partition(PARTITION)  # s3 holds nothing yet
        self.servers = [SimServer(self, s) for s in SERVERS]
        self.owner: tuple[SimServer, int] | None = None
        self.generation = 0
        self.clients = [SimClient(self, c, i + 1, PARTITION) for i, c in enumerate(CLIENTS)]
        self.committed: dict[int, ReqId] = {}  # txid -> request, as feeds delivered it
        self.requests: dict[ReqId, str] = {}  # request -> logical transaction
        self.acked: dict[str, int] = {}  # logical transaction -> txid
        self.settled_uncommitted: dict[ReqId, str] = {}  # request -> how a client settled it
        self.given_up: dict[str, str] = {}  # logical transaction -> why its client gave up
        self._tasks: list[asyncio.Task] = []

    # --- trace and checks -------------------------------------------------------------

    def trace(self, line: str) -> None:
        try:
            now = asyncio.get_running_loop().time()
        except RuntimeError:
            now = 0.0
        self.lines.append(f"{now:9.4f} {line}")

    def fail(self, why: str) -> None:
        if self.failure is None:
            self.failure = why
            self.trace(f"FAILED: {why}")
        raise SimulationFailure(why)

    def delivered(self, txid: int, req_id: ReqId) -> None:
        """A feed delivered ``txid`` as ``req_id``: it is committed."""
        known = self.committed.get(txid)
        if known is not None and known != req_id:
            self.fail(f"fork: transaction {txid} delivered as {known} and as {req_id}")
        self.committed[txid] = req_id
        logical = self.requests.get(req_id)
        settled = self.settled_uncommitted.get(req_id)
        if settled is not None:
            self.fail(f"{logical} ({req_id.seq}) was settled as {settled} but committed at {txid}")
        if logical is not None:
            other = self.acked.get(logical)
            if other is not None and other != txid:
                self.fail(f"{logical} committed twice: transactions {other} and {txid}")
        self._check_quorum(txid)
        for node in self.storages:
            if txid <= _floor(node):
                self._check_clean(node, txid)

    def submitted(self, req_id: ReqId, logical: str) -> None:
        self.requests[req_id] = logical

    def acknowledged(self, logical: str, txid: int) -> None:
        self.acked[logical] = txid

    def never_commits(self, req_id: ReqId, logical: str, why: str) -> None:
        """A client settled ``req_id`` as not committed (lost, refused): the client runs
        the transaction again on that word, so it must hold."""
        known = next((t for t, q in self.committed.items() if q == req_id), None)
        if known is not None:
            self.fail(f"{logical} ({req_id.seq}) was settled as {why} but committed at {known}")
        self.settled_uncommitted[req_id] = why

    def gave_up(self, logical: str, reason: str) -> None:
        self.trace(f"{logical} gave up: {reason}")
        self.given_up[logical] = reason

    def observe(self, node: SimStorageNode, request, response) -> None:
        """After a storage node handled a request: the invariants it could break."""
        if not isinstance(response, SuccessResponse):
            return
        if isinstance(request, StorageAppend):
            if request.session_id < self._last_session[node.name]:
                self.fail(
                    f"{node.name} accepted an append of session {request.session_id} after "
                    f"session {self._last_session[node.name]}"
                )
            self._last_session[node.name] = request.session_id
        elif isinstance(request, TruncateRequest):
            for txid in self.committed:
                if txid > request.transaction_id:
                    self._check_quorum(txid)
        elif isinstance(request, SetLowWaterMarkRequest):
            for txid in range(_floor(node) + 1):
                self._check_clean(node, txid)
            self._check_times(node)

    def _check_quorum(self, txid: int) -> None:
        req_id = self.committed[txid]
        holders = sum(1 for node in self.storages if _holds(node, txid, req_id))
        voters = len(self.zk.metadata.replicas) or REPLICAS
        if holders < voters // 2 + 1:
            self.fail(f"committed transaction {txid} is on {holders} replicas only")

    def _check_clean(self, node: SimStorageNode, txid: int) -> None:
        """What a replica vouches for (up to its local low-water mark) is committed."""
        known = self.committed.get(txid)
        if known is not None and not _holds(node, txid, known):
            self.fail(f"{node.name} forks at {txid}, below its low-water mark {_floor(node)}")

    def _check_times(self, node: SimStorageNode) -> None:
        """Commit times never decrease along the log a replica vouches for, and each
        transaction has one."""
        records = node.logs[PARTITION].records if PARTITION in node.logs else []
        previous = NO_TIMESTAMP
        for txid, _, _, _, timestamp in records[: _floor(node) + 1]:
            if timestamp == NO_TIMESTAMP or timestamp < previous:
                self.fail(
                    f"{node.name}: transaction {txid} committed at {timestamp}, after a "
                    f"transaction committed at {previous}"
                )
                return
            previous = timestamp

    def check(self) -> None:
        """Every invariant, from scratch (at the end)."""
        for txid in self.committed:
            self._check_quorum(txid)
        for node in self.storages:
            for txid in range(_floor(node) + 1):
                self._check_clean(node, txid)
            self._check_times(node)

    # --- running ----------------------------------------------------------------------

    def spawn(self, coro) -> None:
        self._tasks.append(asyncio.get_running_loop().create_task(coro))

    def replica_addresses(self) -> tuple[str, ...]:
        return tuple(f"{s}:1" for s in sorted(self.assignment))

    def change_replicas(self) -> None:
        """Add a replica or remove one, through the admin's check, as `waltz cluster` and
        the operator do; the owner takes the new set at a planned session boundary."""
        rng = self.rng
        if len(self.assignment) > REPLICAS and rng.random() < 0.6:
            new = self.assignment - {rng.choice(sorted(self.assignment))}
        else:
            spare = [s for s in STORAGES if s not in self.assignment]
            if not spare:
                return
            new = self.assignment | {rng.choice(spare)}
        addresses = {f"{s}:1" for s in new}
        problem = replica_change_problem(PARTITION, self.zk.metadata, addresses)
        self.trace(f"assign {sorted(new)}: {'refused: ' + problem if problem else 'done'}")
        if problem is not None:
            return
        for name in new - self.assignment:
            self.storage(name).open_partition(PARTITION)
        self.assignment = new
        if self.owner is not None:
            partition = self.owner[0].partitions.get(PARTITION)
            if partition is not None:
                partition.change_replicas(self.replica_addresses())
        self.retire()

    def retire(self) -> None:
        """A storage node keeps a partition it lost in the assignment while the last
        writing session counts its vote (``still_needed``), then closes it; sometimes its
        disk is then replaced (it was safe to)."""
        for node in self.storages:
            if node.name in self.assignment or not node.holds(PARTITION):
                continue
            if still_needed(self.zk.metadata, node.address):
                continue
            node.close_partition(PARTITION)
            wiped = self.rng.random() < 0.5
            if wiped:
                node.wipe(PARTITION)
                self._last_session[node.name] = -1
            self.trace(f"{node.name} closes the partition" + (", disk replaced" if wiped else ""))

    def storage(self, name: str) -> SimStorageNode:
        return next(s for s in self.storages if s.name == name)

    def move_ownership(self, why: str, prefer: SimServer | None = None) -> None:
        candidates = [s for s in self.servers if s.up and s.zk_ok()]
        self.generation += 1
        if not candidates:
            self.owner = None
            self.trace(f"no server can own the partition ({why})")
            return
        server = prefer if prefer in candidates else self.rng.choice(candidates)
        self.owner = (server, self.generation)
        self.trace(f"ownership -> {server.name} gen {self.generation} ({why})")
        server.own(self.generation)

    async def faults(self) -> None:
        rng = self.rng
        loop = asyncio.get_running_loop()
        while loop.time() < self.duration:
            await asyncio.sleep(rng.uniform(0.3, 2.0))
            kind = rng.choice(
                [
                    "storage-crash",
                    "link-cut",
                    "server-crash",
                    "server-pause",
                    "zk-expiry",
                    "client-cut",
                    "slow-network",
                    "replica-change",
                    "replica-change",
                ]
            )
            self.trace(f"fault: {kind}")
            if kind == "storage-crash":
                node = rng.choice(self.storages)
                if not node.up:
                    continue
                node.crash()
                self.trace(f"{node.name} crashed")
                await asyncio.sleep(rng.uniform(0.1, 3.0))
                node.restart()
                self.trace(f"{node.name} restarted")
            elif kind == "link-cut" and self.owner is not None:
                server = self.owner[0].name
                storage = rng.choice(sorted(self.assignment))
                self.net.cut(server, storage)
                await asyncio.sleep(rng.uniform(0.1, 3.0))
                self.net.heal(server, storage)
            elif kind == "server-crash" and self.owner is not None:
                server = self.owner[0]
                server.crash()
                self.trace(f"server {server.name} crashed")
                await asyncio.sleep(0.5)  # its ZooKeeper session expires
                self.move_ownership(f"{server.name} crashed")
                await asyncio.sleep(rng.uniform(0.1, 2.0))
                server.up = True
                self.net.node_up(server.name)
                self.trace(f"server {server.name} restarted")
            elif kind == "server-pause" and self.owner is not None:
                server = self.owner[0]
                others = [*STORAGES, *CLIENTS, *(s.name for s in self.servers if s is not server)]
                for other in others:
                    self.net.cut(server.name, other)
                server.cut_since = loop.time()
                await asyncio.sleep(rng.uniform(0.5, 3.0))
                server.session_expired = True  # the pause outlived its session
                self.move_ownership(f"{server.name} paused")
                await asyncio.sleep(rng.uniform(0.0, 2.0))
                for other in others:
                    self.net.heal(server.name, other)
                server.cut_since = None
                await asyncio.sleep(rng.uniform(0.0, 0.3))  # before it notices
                await self._session_lost(server)
            elif kind == "zk-expiry" and self.owner is not None:
                server = self.owner[0]
                server.session_expired = True
                self.move_ownership(f"{server.name}'s session expired")
                await asyncio.sleep(rng.uniform(0.0, 0.5))
                await self._session_lost(server)
            elif kind == "client-cut" and self.owner is not None:
                client = rng.choice(CLIENTS)
                self.net.cut(client, self.owner[0].name)
                await asyncio.sleep(rng.uniform(0.1, 2.0))
                self.net.heal(client, self.owner[0].name)
            elif kind == "replica-change":
                self.change_replicas()
            elif kind == "slow-network":
                self.net.max_delay = rng.choice([0.002, 0.05, 0.5])
                self.trace(f"network delays up to {self.net.max_delay} s")

    async def _session_lost(self, server: SimServer) -> None:
        self.trace(f"server {server.name} notices its ZooKeeper session is gone")
        await server.stop_partitions("ZooKeeper session lost")
        server.session_expired = False  # a new session, registered again
        if self.rng.random() < 0.5:
            # Its registration makes the servers rebalance: the partition may come back to
            # it (a new partition object on the same server, clients' connections open).
            await asyncio.sleep(self.rng.uniform(0.0, 0.3))
            current = self.owner[0] if self.owner is not None else None
            if current is not None and current is not server:
                await current.stop_partitions("moved to another server")
            self.move_ownership(f"{server.name} registered again", prefer=server)

    async def main(self) -> None:
        self.move_ownership("start")
        faults = asyncio.get_running_loop().create_task(self.faults())
        clients = [
            asyncio.get_running_loop().create_task(c.run(self.duration)) for c in self.clients
        ]
        await faults
        # Heal everything: the partition must recover and settle every client.
        self.net.max_delay = 0.002
        for a, b in [tuple(sorted(c)) for c in list(self.net.cuts)]:
            self.net.heal(a, b)
        for s in self.storages:
            if not s.up:
                s.restart()
        for s in self.servers:
            s.up, s.cut_since, s.session_expired = True, None, False
            self.net.node_up(s.name)
        if self.owner is None:
            self.move_ownership("healed")
        self.trace("healed")
        await asyncio.gather(*clients)
        self.check()
        await self._final()

    async def _final(self) -> None:
        """Once every fault has healed: the owner's partition becomes active, its members
        catch up with the quorum, and each then holds exactly the committed log."""
        server, _ = self.owner
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 120
        while True:
            partition = server.partitions.get(PARTITION)
            if partition is not None and partition.healthy:
                break
            if loop.time() > deadline:
                state = "no partition object" if partition is None else partition.status
                self.fail(f"the partition did not become active after every fault healed: {state}")
            await asyncio.sleep(0.1)
        await asyncio.sleep(5.0)  # acknowledgements still in flight reach every member
        if not partition.healthy:
            self.fail(f"the partition stopped being active: {partition.status}")
        hwm = partition.high_water_mark
        members = partition.session.members if partition.session else {}
        for address in members:
            name = address.split(":")[0]
            records = next(s for s in self.storages if s.name == name).logs[PARTITION].records
            if len(records) - 1 < hwm:
                self.fail(f"member {name} holds {len(records) - 1} < high-water mark {hwm}")
            node = next(s for s in self.storages if s.name == name)
            for txid in range(hwm + 1):
                known = self.committed.get(txid)
                if known is not None and not _holds(node, txid, known):
                    self.fail(f"member {name} differs from the committed log at {txid}")
        for logical, txid in self.acked.items():
            if txid > hwm:
                self.fail(f"{logical} acknowledged at {txid} above the final mark {hwm}")
        self.trace(
            f"final high-water mark {hwm}, {len(self.acked)} acknowledged, "
            f"{len(self.given_up)} given up"
        )

    def run(self) -> None:
        loop = VirtualTimeLoop()
        asyncio.set_event_loop(loop)
        logging.disable(logging.CRITICAL if not os.environ.get("WALTZ_SIM_LOG") else logging.NOTSET)
        try:
            main = loop.create_task(self.main())
            loop.run_until_complete(asyncio.wait({main}, timeout=self.duration + 300))
            if not main.done():
                stacks = [
                    f"{t.get_coro().__qualname__}: "
                    + " <- ".join(f"{f.f_code.co_name}:{f.f_lineno}" for f in t.get_stack())
                    for t in asyncio.all_tasks(loop)
                ]
                self.failure = "the simulation hung (no progress for 300 s after the end)"
                self.lines += ["pending tasks:", *stacks]
                raise SimulationFailure(self.failure)
            main.result()
            if self.failure is not None:  # raised where nobody re-raised it (a callback)
                raise SimulationFailure(self.failure)
        except SimulationFailure:
            raise SimulationFailure(self.failure) from None
        except BaseException as e:
            self.failure = self.failure or f"{type(e).__name__}: {e}"
            self.trace(f"ERROR: {self.failure}")
            raise SimulationFailure(self.failure) from e
        finally:
            logging.disable(logging.NOTSET)
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            with contextlib.suppress(BaseException):
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
            asyncio.set_event_loop(None)


def _holds(node: SimStorageNode, txid: int, req_id: ReqId) -> bool:
    records = node.logs[PARTITION].records
    return 0 <= txid < len(records) and records[txid][3] == req_id


def _floor(node: SimStorageNode) -> int:
    """The replica's local low-water mark: what it vouches is committed."""
    info = node.control.infos.get(PARTITION)
    return info.local_low_water_mark if info is not None else -1


def report(world: World, tail: int = 60) -> str:
    lines = world.lines[-tail:]
    return (
        f"seed {world.seed} failed: {world.failure}\n"
        f"reproduce: WALTZ_SIM_SEED={world.seed} pytest tests/simulation -k one_seed\n"
        + "\n".join(lines)
    )


__all__ = ["SimulationFailure", "World", "replace", "report"]
