"""The store sessions of one owned partition, one after another.

``SessionLoop`` starts each session through ``recovery_manager``, opens it on its
partition, and waits until it must end: it failed, or it reached a planned boundary
(``session_boundary``'s rule: the checkpoint interval, a missing replica reachable again,
a lagging replica caught up, a new replica set), in which case what is in flight commits
first. Meanwhile it copies lagging replicas in the background (``catch_up``) and runs the
retention steps. The partition (``SessionOwner``, partition.py implements it) keeps the
append task, the commits and the feeds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Protocol

from waltz_client.cluster.retention import RetentionPolicy
from waltz_client.runtime.json_logs import SESSION
from waltz_client.wire.errors import describe
from waltz_client.wire.records import RecordBatch
from waltz_client.wire.storage_client import answers_handshake

from .catch_up import CatchUp
from .recovery import OwnSession
from .recovery_manager import AssignmentChanged, RecoveryContext, Superseded, start_session
from .retention import retention_step
from .session_boundary import RejoinProbes, checkpoint_reached, missing_replicas
from .store_session import StoreSession

# The partition's logger: its sessions' lines read as they did before they moved here.
log = logging.getLogger("waltz_server.partition")


class SessionOwner(Protocol):
    """What the session loop needs of its partition (partition.py implements it)."""

    status: str
    log_start: int  # the first transaction still served

    @property
    def stopped(self) -> bool: ...

    @property
    def healthy(self) -> bool: ...

    @property
    def generation(self) -> int: ...

    @property
    def high_water_mark(self) -> int: ...

    def recovering(self) -> None:
        """No session serves appends now: the append task holds them."""
        ...

    def hold_appends(self) -> None:
        """The session ends at a planned boundary: new appends wait for the next one."""
        ...

    def session_opened(self, session: StoreSession, keep_locks: bool) -> None:
        """A new session serves the partition (``keep_locks``: the lock table is valid)."""
        ...

    def publish_log_start(self, log_start: int) -> None:
        """Retention moved the log start to ``log_start``."""
        ...

    def superseded(self, reason: str) -> None:
        """A newer generation owns the partition: this object must stop."""
        ...


class SessionLoop:
    """Runs one partition's store sessions; ``committed`` is the sessions' commit callback."""

    def __init__(
        self,
        owner: SessionOwner,
        context: RecoveryContext,
        committed: Callable[[RecordBatch, float], None],
        probe_interval: float,
        checkpoint_interval: int,
        retention_interval: float,
        retention_policy: Callable[[], RetentionPolicy] = RetentionPolicy,
    ) -> None:
        self.partition_id = context.partition_id
        self.context = context
        self._owner = owner
        self._committed = committed
        self._probe_interval = probe_interval
        self._checkpoint_interval = checkpoint_interval
        self._retention_interval = retention_interval
        self._retention_policy = retention_policy
        self.session: StoreSession | None = None
        self._own: OwnSession | None = None  # the last session this object ran
        self._rejoin = RejoinProbes(probe_interval)  # missing replicas' next probes
        self._catch_ups: dict[str, CatchUp] = {}  # lagging replicas copied in the background
        self._boundary: asyncio.Future[str] | None = None  # a planned session end, and why

    async def run(self) -> None:
        owner = self._owner
        try:
            while not owner.stopped:
                owner.recovering()
                context = self.context
                try:
                    session = await start_session(context, self._committed, self._report, self._own)
                except Superseded:
                    raise
                except AssignmentChanged as e:
                    # The server learns the new set from its watch (change_replicas).
                    log.info("partition %d: %s; recovering again", self.partition_id, e)
                    owner.status = f"recovering: {e}"
                    await asyncio.sleep(self.context.retry_delay)
                    continue
                except Exception as e:  # a bug: say so, and try again rather than hang
                    log.exception("partition %d: recovery failed unexpectedly", self.partition_id)
                    owner.status = f"recovery failed: {e}"
                    await asyncio.sleep(self.context.retry_delay)
                    continue
                if owner.stopped:  # stopped meanwhile (a swallowed cancel)
                    await session.close("partition stopped")
                    return
                self._open(session)
                reason = await self._watch(session, context)
                self._stop_catch_ups()
                owner.recovering()
                self._own = OwnSession(session.session_id, owner.high_water_mark)
                await session.close(reason)
                self.session = None
                SESSION.set(None)  # until recovery picks the next session's ID
        except Superseded as e:
            if owner.stopped:
                return  # already replaced: the server's current partition is not ours
            log.warning("partition %d: %s", self.partition_id, e)
            owner.status = f"superseded: {e}"
            owner.superseded(str(e))

    async def close(self, reason: str) -> None:
        """The partition stopped (its tasks are cancelled): end the copies and the session."""
        self._stop_catch_ups()
        if self.session is not None:
            await self.session.close(reason)

    def _report(self, status: str) -> None:
        self._owner.status = status

    def _open(self, session: StoreSession) -> None:
        self.session = session
        # The lock table stays valid only if every transaction the recovery kept took
        # its locks here: this object ran the session that wrote last (any other writer,
        # even this server's earlier partition object, would be a newer writing session).
        own = self._own
        keep_locks = own is not None and session.previous_writer == own.session_id
        self._owner.session_opened(session, keep_locks)
        for address, position in sorted(session.lagging.items()):
            self._catch_ups[address] = CatchUp(
                partition_id=self.partition_id,
                session_id=session.session_id,
                address=address,
                position=position,
                source=partial(_source, session),
                committed=lambda: self._owner.high_water_mark,
                on_caught_up=lambda a: self.end_session(f"replica {a} caught up"),
                cluster_key=self.context.cluster_key,
                num_partitions=self.context.num_partitions,
                timeout=self.context.connect_timeout,
                settings=self.context.catch_up,
                open_connection=self.context.open_connection,
            )

    def replica_positions(self) -> dict[str, tuple[bool, int | None]]:
        """Each assigned replica: (a member of the running store session, the highest
        transaction ID it holds as far as this server knows; None: unknown)."""
        session = self.session
        out: dict[str, tuple[bool, int | None]] = {}
        for address in self.context.replicas:
            if session is not None and not session.failed and address in session.members:
                out[address] = (True, session.core.members[address].acked)
            elif address in self._catch_ups and not self._catch_ups[address].task.done():
                out[address] = (False, self._catch_ups[address].progress.copied_through)
            else:
                out[address] = (False, None)
        return out

    async def retention_loop(self) -> None:
        while True:
            await asyncio.sleep(self._retention_interval)
            await self.apply_retention()

    async def apply_retention(self) -> None:
        """One retention step (see ``retention``); failures wait for the next one."""
        owner = self._owner
        session = self.session
        if not owner.healthy or session is None or session.failed:
            return
        try:
            await retention_step(
                session=session,
                metadata=self.context.metadata,
                generation=owner.generation,
                policy=self._retention_policy(),
                current=owner.log_start,
                high_water_mark=owner.high_water_mark,
                now_ms=int(time.time() * 1000),
                publish=owner.publish_log_start,
            )
        except Exception as e:  # ZooKeeper or storage unavailable: the next step retries
            log.warning("partition %d: retention step failed: %s", self.partition_id, describe(e))

    def _stop_catch_ups(self) -> None:
        for catch_up in self._catch_ups.values():
            catch_up.cancel()
        self._catch_ups.clear()

    def end_session(self, reason: str) -> None:
        """End the running store session at a planned boundary (what is in flight commits
        first); the next recovery runs with the current context."""
        if self._boundary is not None and not self._boundary.done():
            self._boundary.set_result(reason)

    def change_replicas(self, replicas: tuple[str, ...]) -> None:
        """The partition's replica set changed: the next session uses the new one. The
        partition object, its feeds and mounts stay."""
        self.context = replace(self.context, replicas=replicas)
        self.end_session("the replica set changed")

    async def _watch(self, session: StoreSession, context: RecoveryContext) -> str:
        """Wait until the session must end; the reason. A planned end (the checkpoint
        interval, a replica back or caught up, a new replica set) first lets what is in
        flight commit."""
        reason = await self._until_end(session, context)
        if not session.ended.done():
            self._owner.hold_appends()  # the append task holds new appends for the next session
            await session.drain(self.context.connect_timeout)
        return reason

    async def _until_end(self, session: StoreSession, context: RecoveryContext) -> str:
        self._boundary = asyncio.get_running_loop().create_future()
        if self.context.replicas != context.replicas:
            return "the replica set changed"  # while this session recovered
        self._rejoin.joined(session.members)
        while True:
            await asyncio.wait(
                {session.ended, self._boundary},
                timeout=self._probe_interval,
                return_when=asyncio.FIRST_COMPLETED,
            )
            if session.ended.done():
                return str(session.ended.exception())
            if self._boundary.done():
                return self._boundary.result()
            copying = {a for a, c in self._catch_ups.items() if not c.task.done()}
            missing = missing_replicas(self.context.replicas, session.members, copying)
            now = asyncio.get_running_loop().time()
            session.check_stragglers(now, self.context.connect_timeout)
            await session.ping(self.context.connect_timeout)
            if session.ended.done():
                return str(session.ended.exception())
            if checkpoint_reached(
                self._owner.high_water_mark,
                session.start_high_water_mark,
                self._checkpoint_interval,
            ):
                return "checkpoint interval reached"
            for address in missing:
                now = asyncio.get_running_loop().time()
                if self._rejoin.due(address, now) and await _reachable(address, self.context):
                    return self._rejoin.reachable_again(address, now)


async def _reachable(address: str, context: RecoveryContext, timeout: float = 1.0) -> bool:
    """Whether a storage node answers the handshake (a returning replica: time for a new
    session that includes it)."""
    return await answers_handshake(address, timeout, context.open_connection)


def _source(session: StoreSession) -> str | None:
    """The member to copy a lagging replica from: the one that acknowledged the most."""
    member = session.reader(session.high_water_mark)
    return member.address if member is not None else None
