"""Running the Recovery Procedure against real storage nodes and ZooKeeper.

The decisions are ``recovery.py``'s; this shell does the I/O in the spec's
order: a new session ID by compare-and-set on the partition metadata (which
also records this owner's generation, refusing an older one), replica
sessions to every assigned storage node (the first request with the new
session fences the old one there), truncation of dirty tails, the vote
(waiting while it is undecidable), catch-up of replicas behind the decided
mark, low-water marks, and the metadata's replica states by compare-and-set.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeVar

from kazoo.exceptions import KazooException

from waltz_client.cluster.metadata import PartitionMetadata
from waltz_client.cluster.replica_safety import writing_session
from waltz_client.runtime.json_logs import set_log_context
from waltz_client.runtime.tasks import wait_for
from waltz_client.wire.errors import ProtocolError, describe
from waltz_client.wire.framing import OpenConnection
from waltz_client.wire.records import RecordBatch
from waltz_client.wire.storage_client import StorageClient, StorageFailure
from waltz_client.wire.storage_messages import StorageError

from .catch_up import CatchUpSettings
from .commit_clock import NO_TIME
from .recovery import (
    Assessment,
    JoinMode,
    OwnSession,
    StorageView,
    closing_metadata,
    decide,
    dirty_tails,
    far_behind,
    join_mode,
    join_order,
    pick_source,
    plan_replica,
    position_after_log_start,
    replicas_to_reach,
)
from .recovery_vote import Undecidable, majority
from .storage_pool import PoolKey, StoragePool
from .store_session import Member, StoreSession

log = logging.getLogger(__name__)
T = TypeVar("T")

CATCH_UP_CHUNK = 2000


class Superseded(Exception):
    """A newer generation owns the partition: this server must stop serving it."""


class MetadataConflict(Exception):
    """The partition metadata changed under a compare-and-set."""


class AssignmentChanged(Exception):
    """The partition's replica assignment changed while a session recovered with the old
    one. Its metadata must not name a replica that may have left since (the node may
    already have closed the partition, and the next recovery would wait for its vote for
    ever): recover again with the new set."""


class OlderStorageNode(ProtocolError):
    """A storage node of a protocol version without commit times (before 3): this
    server's records carry them, so it leaves the node out rather than drop them."""


class RecoveryStalled(Exception):
    """This attempt cannot finish now (too few replicas, a newer session appeared...)."""


class MetadataStore(Protocol):
    async def read(self, partition_id: int) -> tuple[PartitionMetadata, int]: ...

    async def write(
        self,
        partition_id: int,
        metadata: PartitionMetadata,
        version: int,
        replicas: tuple[str, ...] | None = None,
    ) -> int:
        """Compare-and-set; the new version. Raises MetadataConflict. With ``replicas``,
        also checks, in the same ZooKeeper transaction, that the partition is still
        assigned exactly those replicas; raises AssignmentChanged if not."""
        ...


@dataclass(frozen=True)
class RecoveryContext:
    partition_id: int
    generation: int
    replicas: tuple[str, ...]  # host:port of every storage node assigned the partition
    cluster_key: uuid.UUID
    num_partitions: int
    metadata: MetadataStore
    connect_timeout: float = 5.0
    retry_delay: float = 1.0
    max_batch_bytes: int = 4 * 1024 * 1024
    max_in_flight: int = 16
    max_member_backlog_bytes: int = 64 * 1024 * 1024
    catch_up: CatchUpSettings = field(default_factory=CatchUpSettings)
    # How storage nodes are reached (a simulated network in tests/simulation).
    open_connection: OpenConnection = asyncio.open_connection
    # The server's shared connections, one a storage node, for the store session's
    # appends (storage_pool.py); None: the session keeps recovery's own connections.
    pool: StoragePool | None = None
    # The server's shared connections for recoveries, one a storage node and apart from
    # the appends' (so a recovery never queues behind them): when many partitions
    # recover at once (a failover, a rolling restart), they share these instead of each
    # dialling three of its own (with TLS, three handshakes each). Used with ``pool``
    # only (without it, recovery's connections become the session's); None: each
    # recovery dials its own.
    recovery_pool: StoragePool | None = None

    @property
    def borrows_connections(self) -> bool:
        return self.pool is not None and self.recovery_pool is not None


_RETRYABLE = (
    KazooException,
    StorageFailure,
    ConnectionError,
    OSError,
    ProtocolError,
    asyncio.TimeoutError,
    MetadataConflict,
    RecoveryStalled,
)


async def start_session(
    ctx: RecoveryContext,
    on_commit: Callable[[RecordBatch, float], None],
    report: Callable[[str], None] = lambda status: None,
    own: OwnSession | None = None,
) -> StoreSession:
    """Recover the partition and open a store session; retries until it succeeds or the
    partition is superseded (raises Superseded), or its replica set changed (raises
    AssignmentChanged: the caller recovers with the new set). ``own``: the session this
    server ran last for the partition, if any (see ``recovery.decide``)."""
    while True:
        try:
            return await _attempt(ctx, on_commit, report, own)
        except (Superseded, AssignmentChanged):
            raise
        except _RETRYABLE as e:
            report(f"recovery retrying: {describe(e)}")
            log.warning("partition %d: recovery attempt failed: %s", ctx.partition_id, describe(e))
            await asyncio.sleep(ctx.retry_delay)


async def _new_session_id(ctx: RecoveryContext) -> tuple[PartitionMetadata, int]:
    meta, version = await ctx.metadata.read(ctx.partition_id)
    if meta.generation > ctx.generation:
        raise Superseded(
            f"partition {ctx.partition_id}: generation {meta.generation} is newer than ours "
            f"({ctx.generation})"
        )
    meta = replace(meta, generation=ctx.generation, session_id=meta.session_id + 1)
    version = await ctx.metadata.write(ctx.partition_id, meta, version)
    return meta, version


async def _timed(ctx: RecoveryContext, client: StorageClient, call: Awaitable[T]) -> T:
    """A storage call on ``client`` that must answer within the storage timeout (a
    paused node would otherwise hold recovery forever). A connection silent that long is
    closed (and, shared, dropped from the recovery pool): the next attempt dials afresh."""
    try:
        return await wait_for(call, ctx.connect_timeout)
    except TimeoutError:
        if ctx.borrows_connections:
            assert ctx.recovery_pool is not None
            ctx.recovery_pool.discard_client(client, "silent past the storage timeout")
        else:
            client.close_soon()
        raise


def _pool_key(ctx: RecoveryContext, address: str) -> PoolKey:
    return PoolKey(address, ctx.cluster_key, ctx.num_partitions)


async def _let_go(ctx: RecoveryContext, address: str, client: StorageClient) -> None:
    """Done with a recovery connection: given back to the recovery pool, or closed."""
    if ctx.borrows_connections:
        assert ctx.recovery_pool is not None
        await ctx.recovery_pool.release(_pool_key(ctx, address), client)
    else:
        await client.close()


async def _connect(
    ctx: RecoveryContext, address: str, session_id: int
) -> tuple[StorageClient, StorageView]:
    if ctx.borrows_connections:
        assert ctx.recovery_pool is not None
        client = await ctx.recovery_pool.acquire(_pool_key(ctx, address), ctx.connect_timeout)
    else:
        host, _, port = address.rpartition(":")
        client = await StorageClient.connect(
            host, int(port), timeout=ctx.connect_timeout, open_connection=ctx.open_connection
        )
    try:
        if not client.speaks_commit_time:
            raise OlderStorageNode(
                f"storage {address} speaks storage protocol {client.version}, which stores "
                f"no commit times; upgrade the storage nodes before the servers "
                f"(docs/operations.md, Upgrading)"
            )
        if not ctx.borrows_connections:
            await _timed(ctx, client, client.open(ctx.cluster_key, ctx.num_partitions))
        p = ctx.partition_id
        # Both at once: one round trip (the node answers them in order, the first fencing
        # the older sessions).
        info, top = await asyncio.gather(
            _timed(ctx, client, client.last_session_info(session_id, p)),
            _timed(ctx, client, client.max_transaction_id(session_id, p)),
        )
    except BaseException:
        await _let_go(ctx, address, client)
        raise
    view = StorageView(info.last_session_id, info.low_water_mark, info.local_low_water_mark, top)
    return client, view


async def _attempt(
    ctx: RecoveryContext,
    on_commit: Callable[[RecordBatch, float], None],
    report: Callable[[str], None],
    own: OwnSession | None,
) -> StoreSession:
    p = ctx.partition_id
    meta, version = await _new_session_id(ctx)
    session_id = meta.session_id
    # The session loop's task: its lines from here on, and the tasks it starts (the
    # store session's writer, catch-ups), name this session.
    set_log_context(partition=p, session=session_id)
    report(f"recovering in session {session_id}")
    clients: dict[str, StorageClient] = {}
    shared: list[Member] = []  # members given the server's shared connections
    handed_over = False
    try:
        assessments, decided = await _vote(ctx, meta, session_id, clients, report, own)
        positions, refused = await _cut_dirty_tails(ctx, session_id, clients, assessments, decided)
        if meta.log_start > 0:
            await _apply_log_start(ctx, session_id, meta.log_start, clients, positions, refused)
        votes = {a: x.vote for a, x in assessments.items() if a not in refused}
        # The last commit's time is read while the replicas are cleaned, from one that
        # certainly holds it: a round trip less before the partition serves.
        early = asyncio.ensure_future(
            _commit_time_from_source(ctx, session_id, clients, positions, votes, decided)
        )
        try:
            members, lagging = await _admit(
                ctx, session_id, clients, positions, votes, refused, decided
            )
        except BaseException:
            early.cancel()
            await asyncio.gather(early, return_exceptions=True)
            raise
        last_commit_time = await early
        if last_commit_time is None:
            last_commit_time = await _last_commit_time(ctx, session_id, members, decided)
        if ctx.pool is not None:
            await _share(ctx, members, shared)
        new_meta = closing_metadata(
            meta, ctx.generation, session_id, ctx.replicas, members, decided
        )
        # Checked against the assignment in the same transaction: a replica removed
        # meanwhile may have closed the partition, and must not be named a member.
        await ctx.metadata.write(p, new_meta, version, replicas=ctx.replicas)
        log.info(
            "partition %d: session %d recovered to high-water mark %d with replicas %s",
            p,
            session_id,
            decided,
            ", ".join(sorted(members)),
        )
        session = StoreSession(
            p,
            session_id,
            members,
            len(ctx.replicas),
            decided,
            on_commit,
            max_batch_bytes=ctx.max_batch_bytes,
            max_in_flight=ctx.max_in_flight,
            max_member_backlog_bytes=ctx.max_member_backlog_bytes,
            previous_writer=writing_session(meta),
            pool=ctx.pool,
        )
        session.lagging = lagging
        session.log_start = meta.log_start
        session.last_commit_time = last_commit_time
        kept = {id(m.client) for m in members.values()}
        for address, client in clients.items():
            if id(client) not in kept:
                await _let_go(ctx, address, client)
        handed_over = True
        return session
    finally:
        if not handed_over:
            for address, client in clients.items():
                with contextlib.suppress(Exception):
                    await _let_go(ctx, address, client)
            for member in shared:
                assert ctx.pool is not None and member.shared is not None
                with contextlib.suppress(Exception):
                    await ctx.pool.release(member.shared, member.client)


async def _vote(
    ctx: RecoveryContext,
    meta: PartitionMetadata,
    session_id: int,
    clients: dict[str, StorageClient],
    report: Callable[[str], None],
    own: OwnSession | None,
) -> tuple[dict[str, Assessment], int]:
    """Connect to the voters (into ``clients``) until the vote decides; the assessments
    and the decided high-water mark."""
    p = ctx.partition_id
    views: dict[str, StorageView] = {}
    dial = replicas_to_reach(meta, ctx.replicas)
    while True:
        missing = [a for a in dial if a not in clients]
        results = await asyncio.gather(
            *(_connect(ctx, a, session_id) for a in missing), return_exceptions=True
        )
        for address, result in zip(missing, results, strict=True):
            if isinstance(result, StorageFailure) and result.error == StorageError.SESSION_FENCED:
                raise RecoveryStalled(f"a newer session exists: {result}")
            if isinstance(result, OlderStorageNode):
                log.warning("partition %d: replica %s left out: %s", p, address, result)
                continue
            if isinstance(result, BaseException):
                log.info("partition %d: replica %s unreachable: %s", p, address, describe(result))
                continue
            clients[address], views[address] = result
        assessments, decision = decide(meta, ctx.replicas, views, own)
        if not isinstance(decision, Undecidable):
            return assessments, decision.high_water_mark
        report(f"waiting: {decision}")
        log.warning("partition %d: %s", p, decision)
        await asyncio.sleep(ctx.retry_delay)


async def _cut_dirty_tails(
    ctx: RecoveryContext,
    session_id: int,
    clients: Mapping[str, StorageClient],
    assessments: Mapping[str, Assessment],
    decided: int,
) -> tuple[dict[str, int], set[str]]:
    """Truncate the dirty tails the assessments found; (each replica's clean position,
    the replicas left out because their truncation failed)."""
    p = ctx.partition_id
    truncations = dirty_tails(assessments, ctx.replicas)
    positions: dict[str, int] = {}
    refused: set[str] = set()
    for address, a in assessments.items():
        if address in truncations:
            try:
                client = clients[address]
                await _timed(ctx, client, client.truncate(session_id, p, truncations[address]))
            except _RETRYABLE as e:
                # One replica that cannot be cut back (down now, or claiming more is
                # committed than the quorum decided) must not stall the others: it
                # is left out of this session, like one that fails its cleaning.
                log.error(
                    "partition %d: replica %s left out of session %d: truncating it to "
                    "the decided high-water mark %d failed: %s",
                    p,
                    address,
                    session_id,
                    decided,
                    describe(e),
                )
                refused.add(address)
                continue
        positions[address] = a.vote  # clean up to here (a removed voter is only read)
    return positions, refused


async def _admit(
    ctx: RecoveryContext,
    session_id: int,
    clients: Mapping[str, StorageClient],
    positions: dict[str, int],
    votes: Mapping[str, int],
    refused: set[str],
    decided: int,
) -> tuple[dict[str, Member], dict[str, int]]:
    """Bring the reachable assigned replicas to ``decided`` (``join_mode`` says how); the
    members of the new session, and the lagging replicas left to a background copy (at
    their positions). Raises RecoveryStalled without a quorum of members."""
    p = ctx.partition_id
    quorum = majority(len(ctx.replicas))
    members: dict[str, Member] = {}
    lagging: dict[str, int] = {}
    candidates = [a for a in clients if a in ctx.replicas and a not in refused]
    order = join_order(candidates, positions, decided)
    inline = ctx.catch_up.inline_records
    # The replicas near the mark join inline whatever the others do: all at once (each a
    # round trip and a sync on its node), in the join order's place. The far ones then
    # go one by one, since whether one is needed depends on how many joined before it.
    near = [a for a in order if not far_behind(positions[a], decided, inline)]

    async def join(address: str) -> bool:
        try:
            await _clean(
                ctx, session_id, clients[address], clients, positions, votes, address, decided
            )
        except _RETRYABLE as e:
            _left_out(p, address, session_id, e)
            return False
        return True

    for address, joined in zip(near, await asyncio.gather(*map(join, near)), strict=True):
        if joined:
            members[address] = Member(address, clients[address])
    for address in order[len(near) :]:
        client = clients[address]
        mode = join_mode(positions[address], decided, len(members), quorum, inline)
        try:
            if mode is JoinMode.BACKGROUND:
                # Its log is a committed prefix: say so, so that the copy is kept.
                await _timed(
                    ctx, client, client.set_low_water_mark(session_id, p, positions[address])
                )
                lagging[address] = positions[address]
                continue
            await _clean(ctx, session_id, client, clients, positions, votes, address, decided)
        except _RETRYABLE as e:
            _left_out(p, address, session_id, e)
            continue
        members[address] = Member(address, client)
    if len(members) < quorum:
        raise RecoveryStalled(
            f"only {len(members)} of {len(ctx.replicas)} replicas are clean at {decided}"
        )
    return members, lagging


def _left_out(partition: int, address: str, session_id: int, error: BaseException) -> None:
    log.warning(
        "partition %d: replica %s left out of session %d: %s",
        partition,
        address,
        session_id,
        describe(error),
    )


async def _commit_time_from_source(
    ctx: RecoveryContext,
    session_id: int,
    clients: Mapping[str, StorageClient],
    positions: Mapping[str, int],
    votes: Mapping[str, int],
    decided: int,
) -> int | None:
    """``_last_commit_time`` read from a replica whose clean log reaches ``decided``
    (``pick_source``, as a catch-up reads from), before the replicas are cleaned; None
    when that does not answer (then a member is asked, as before)."""
    if decided < 0:
        return NO_TIME
    try:
        client = clients[pick_source(positions, votes, decided)]
        header = await _timed(
            ctx, client, client.record_header(session_id, ctx.partition_id, decided)
        )
    except asyncio.CancelledError:
        raise
    except Exception as e:  # its errors are the member read's to decide on
        log.debug("partition %d: commit time not read early: %s", ctx.partition_id, describe(e))
        return None
    return header.timestamp


async def _last_commit_time(
    ctx: RecoveryContext, session_id: int, members: Mapping[str, Member], decided: int
) -> int:
    """The commit time of the last committed transaction, read from a member (each holds
    every committed one): the floor of the new session's commit clock. NO_TIME when
    nothing is committed or the record has none (written before commit times)."""
    if decided < 0:
        return NO_TIME
    p = ctx.partition_id
    for address, member in sorted(members.items()):
        try:
            client = member.client
            header = await _timed(ctx, client, client.record_header(session_id, p, decided))
        except StorageFailure as e:
            if e.error != StorageError.TRANSACTION_NOT_FOUND:
                raise
            # Retention skipped this replica past it: another may still hold it.
            log.info("partition %d: %s has no transaction %d: %s", p, address, decided, e)
            continue
        return header.timestamp
    return NO_TIME


async def _share(ctx: RecoveryContext, members: dict[str, Member], shared: list[Member]) -> None:
    """Swap each member's recovery connection for the server's shared one to its node
    (appended to ``shared`` as each is acquired, so that a failure releases them)."""
    assert ctx.pool is not None
    for address in list(members):
        key = PoolKey(address, ctx.cluster_key, ctx.num_partitions)
        client = await ctx.pool.acquire(key, ctx.connect_timeout)
        members[address] = Member(address, client, shared=key)
        shared.append(members[address])


async def _apply_log_start(
    ctx: RecoveryContext,
    session_id: int,
    log_start: int,
    clients: Mapping[str, StorageClient],
    positions: dict[str, int],
    refused: set[str],
) -> None:
    """Retention: every replica of the session drops what is below the partition's log
    start; one whose log ends below it (empty, or far behind) skips ahead to start
    empty there, and is then copied from there (nothing below it is kept anywhere)."""
    p = ctx.partition_id
    for address in sorted(positions):
        client = clients[address]
        if address in refused or address not in ctx.replicas or not client.speaks_retention:
            continue
        try:
            await _timed(ctx, client, client.set_log_start(session_id, p, log_start))
        except _RETRYABLE as e:
            log.error(
                "partition %d: replica %s left out of session %d: moving its log start to "
                "%d failed: %s",
                p,
                address,
                session_id,
                log_start,
                describe(e),
            )
            refused.add(address)
            continue
        moved = position_after_log_start(positions[address], log_start)
        if moved != positions[address]:
            log.info(
                "partition %d: replica %s skipped ahead from %d to the log start %d",
                p,
                address,
                positions[address],
                log_start,
            )
            positions[address] = moved


async def _clean(
    ctx: RecoveryContext,
    session_id: int,
    client: StorageClient,
    clients: Mapping[str, StorageClient],
    positions: Mapping[str, int],
    votes: Mapping[str, int],
    address: str,
    decided: int,
) -> None:
    """Bring one replica to exactly the committed prefix ``..decided`` and mark it clean."""
    p = ctx.partition_id
    plan = plan_replica(positions[address], decided)
    if plan.truncate_to is not None:
        await _timed(ctx, client, client.truncate(session_id, p, plan.truncate_to))
    if plan.catch_up_from is not None:
        source = clients[pick_source(positions, votes, decided)]
        next_txid = plan.catch_up_from
        while next_txid <= decided:
            count = min(CATCH_UP_CHUNK, decided - next_txid + 1)
            batch = await _timed(ctx, source, source.records(session_id, p, next_txid, count))
            if not len(batch) or batch.first_txid != next_txid:
                raise RecoveryStalled(f"catch-up source returned {batch!r} for {next_txid}")
            await _timed(ctx, client, client.append(session_id, p, batch))
            next_txid = batch.last_txid + 1
    await _timed(ctx, client, client.set_low_water_mark(session_id, p, decided))
