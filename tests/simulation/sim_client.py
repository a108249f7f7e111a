"""A simulated Waltz client: the real client's decisions over the simulated network.

What a client decides is the client library's own code: ``ClientPartition`` (the mount's
phase, which feed rows are next, what each Mount, Flush, feed row, Lock Failure or
refusal settles, when to mount again and how long to wait between attempts) and
``SubmissionRetries`` (what follows each attempt: done, or sent again after a backoff,
or given up after ``max_retries``), with ``append_request`` building each Append. This
module is only their I/O shell, as ``waltz_client.client`` is for real: it opens the
connection, feeds the core every message the network delivers, sends what it decides,
and sleeps the pauses it returns on the virtual clock.

Its application appends logical transactions (``c1-17``: one per submission) and applies
every feed row by reporting it to the world, which checks the log's invariants.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Protocol

from sim_net import SimNetwork, open_stream

from waltz_client.append import append_request
from waltz_client.client_partition import ClientPartition, MountPhase
from waltz_client.config import WaltzClientConfig
from waltz_client.errors import WaltzError
from waltz_client.monitor import Resolution
from waltz_client.submit_policy import Finish, RetryAfter, SubmissionRetries
from waltz_client.transaction import TransactionBuilder
from waltz_client.wire.client_messages import (
    ClientMessage,
    FeedRows,
    FlushRequest,
    MountRequest,
    MountStatus,
)
from waltz_client.wire.records import ReqId
from waltz_client.wire.server_connection import ServerConnection

# The client library's defaults (max_retries, retry_backoff), as an application gets them.
DEFAULTS = WaltzClientConfig("zookeeper:2181")
CONNECT_TIMEOUT = 2.0
MOUNT_TIMEOUT = 5.0
NO_OWNER_WAIT = 0.2  # the simulated ZooKeeper view has no change notification: poll


class Server(Protocol):
    name: str


class ClientWorld(Protocol):
    """What a client needs of the world: its network, clock-driven randomness, where the
    partition is owned, and the invariant checks its feed and results feed."""

    net: SimNetwork
    rng: random.Random

    @property
    def owner(self) -> tuple[Server, int] | None: ...

    def trace(self, line: str) -> None: ...

    def fail(self, why: str) -> None: ...

    def submitted(self, req_id: ReqId, logical: str) -> None: ...

    def delivered(self, txid: int, req_id: ReqId) -> None: ...

    def acknowledged(self, logical: str, txid: int) -> None: ...

    def never_commits(self, req_id: ReqId, logical: str, why: str) -> None: ...

    def gave_up(self, logical: str, reason: str) -> None: ...


@dataclass(eq=False)
class SimSubmission:
    """One logical transaction: its attempts, and the request of the latest."""

    logical: str
    retries: SubmissionRetries
    req_id: ReqId | None = None
    due: float = 0.0  # not sent (again) before this virtual time


class SimClient:
    def __init__(self, world: ClientWorld, name: str, client_id: int, partition: int) -> None:
        self.world = world
        self.name = name
        self.client_id = client_id
        self.partition = partition
        # Its application applies every transaction (it reports each to the world), so
        # it mounts from the last one delivered.
        self.core: ClientPartition[SimSubmission] = ClientPartition(
            partition, True, DEFAULTS.retry_backoff
        )
        self.conn: ServerConnection | None = None
        self.connection_seq = 0
        self.seq = 0
        self.counter = 0
        self.remount = True  # the core said so, or the connection closed
        self.answer: MountStatus | WaltzError | None = None  # to the mount under way
        self.unsent: list[SimSubmission] = []  # new, or lost and waiting to go again
        self.committed = 0
        self.given_up = 0

    def next_req(self, generation: int) -> ReqId:
        self.seq += 1
        return ReqId(self.client_id, generation, self.partition, self.seq)

    # --- what the network delivers ------------------------------------------------------

    def on_message(self, m: ClientMessage) -> None:
        core = self.core
        if isinstance(m, FeedRows):
            if core.is_current_feed(m.req_id):
                self._apply(m)
            return
        reaction = core.receive(m)
        self._settle(reaction.settled)
        if reaction.mount_status is not None:
            self.answer = reaction.mount_status
        elif reaction.mount_error is not None:
            self.answer = reaction.mount_error
        if reaction.remount:
            if reaction.note:
                self.world.trace(f"{self.name}: {reaction.note}")
            self.remount = True

    def _apply(self, m: FeedRows) -> None:
        core, world = self.core, self.world
        span = core.deliverable(m.rows)
        for txid, client_id, generation, partition_id, seq, _, _ in m.rows[span.start : span.stop]:
            req_id = ReqId(client_id, generation, partition_id, seq)
            settled = core.commit_seen(req_id, txid)
            core.delivered(txid)
            world.delivered(txid, req_id)
            self._settle(settled)
        if span.gap is not None:
            world.fail(f"{self.name}: feed gap: {span.gap} after {core.applied}")

    def _settle(self, resolutions: list[Resolution[SimSubmission]]) -> None:
        """Carry out what the retry policy says about each settled attempt."""
        world = self.world
        now = asyncio.get_running_loop().time()
        for r in resolutions:
            sub = r.item
            assert sub.req_id is not None
            step = sub.retries.after(r)
            if isinstance(step, Finish):
                if step.result.committed:
                    self.committed += 1
                    world.acknowledged(sub.logical, step.result.transaction_id)
                else:
                    world.never_commits(sub.req_id, sub.logical, r.outcome.value)
                    self._give_up(sub, step.result.reason)
            elif isinstance(step, RetryAfter):
                world.never_commits(sub.req_id, sub.logical, r.outcome.value)
                world.trace(
                    f"{self.name}: {sub.logical} ({sub.req_id.seq}) settled as lost: resend"
                )
                sub.due = now + step.pause
                self.unsent.append(sub)
            else:  # a lock failure: these appends take no locks
                world.fail(f"{self.name}: {sub.logical} failed on a lock it never took")

    def _give_up(self, sub: SimSubmission, reason: str) -> None:
        self.given_up += 1
        self.world.gave_up(sub.logical, reason)

    # --- what it does -------------------------------------------------------------------

    async def run(self, until: float) -> None:
        loop = asyncio.get_running_loop()
        rng = self.world.rng
        core = self.core
        while loop.time() < until or self.unsent or core.monitor:
            if loop.time() > until + 120:
                self.world.fail(
                    f"{self.name}: could not settle {len(core.monitor) + len(self.unsent)} "
                    "submissions"
                )
            if self.remount or self.conn is None or self.conn.closed_reason is not None:
                await self._mount()
                continue
            if loop.time() < until and rng.random() < 0.6:
                self.counter += 1
                retries = SubmissionRetries(DEFAULTS.max_retries, DEFAULTS.retry_backoff)
                self.unsent.append(SimSubmission(f"{self.name}-{self.counter}", retries))
            self._send_due(loop.time())
            if core.monitor and rng.random() < 0.3:
                q = self.next_req(core.generation)
                core.flush_sent(q)
                self.conn.send(FlushRequest(q))
            await asyncio.sleep(rng.uniform(0.005, 0.2))
        if self.conn is not None:
            await self.conn.close()

    def _send_due(self, now: float) -> None:
        """Appends go out while mounted, each once its backoff has passed; a submission
        out of attempts gives up instead."""
        if self.core.phase is not MountPhase.MOUNTED:
            return
        waiting = []
        for sub in self.unsent:
            if sub.due > now:
                waiting.append(sub)
            elif sub.retries.may_attempt(closed=False):
                self._append(sub)
            else:
                self._give_up(sub, sub.retries.gave_up().reason)
        self.unsent = waiting

    def _append(self, sub: SimSubmission) -> None:
        assert self.conn is not None
        core = self.core
        sub.retries.begin_attempt()
        builder = TransactionBuilder(self.partition, core.applied)
        builder.set_data(sub.logical.encode())
        q = self.next_req(core.generation)
        sub.req_id = q
        core.monitor.sent(q, sub)
        self.world.submitted(q, sub.logical)
        self.conn.send(append_request(q, builder))

    async def _mount(self) -> None:
        """The reconnect procedure, on a new connection each time."""
        world, core = self.world, self.core
        core.remounting()
        self.remount = False
        if self.conn is not None:
            await self.conn.close()
            self.conn = None
        owner = world.owner
        if owner is None:
            await asyncio.sleep(NO_OWNER_WAIT)
            self.remount = True
            return
        server, generation = owner
        try:
            self.conn = await asyncio.wait_for(
                ServerConnection.connect(
                    server.name,
                    1,
                    on_message=self.on_message,
                    open_connection=lambda host, port: open_stream(
                        world.net, self.name, host, port
                    ),
                    feed_rows=True,  # as the client library's stream reads its feed
                ),
                CONNECT_TIMEOUT,
            )
        except Exception as e:  # refused, timed out, closed during the handshake
            world.trace(f"{self.name}: connect to {server.name} failed: {type(e).__name__}")
            await self._retry(core.mount_failed(e).pause)
            return
        self.connection_seq += 1
        q = self.next_req(generation)
        core.mount_sent(q, core.applied)
        self.answer = None
        self.remount = False  # what an older mount said while this one was prepared
        world.trace(
            f"{self.name}: mount at {server.name} gen {generation} from {core.applied} ({q.seq})"
        )
        self.conn.send(MountRequest(q, core.applied, self.connection_seq))
        deadline = asyncio.get_running_loop().time() + MOUNT_TIMEOUT
        while self.answer is None and not self.remount:
            if asyncio.get_running_loop().time() > deadline or self.conn.closed_reason:
                await self._retry(core.mount_failed(TimeoutError("no answer")).pause)
                return
            await asyncio.sleep(0.05)
        answer = self.answer
        if answer is None:  # told to mount again while waiting
            core.mount_abandoned()
            return
        if isinstance(answer, WaltzError):
            world.trace(f"{self.name}: mount refused: {answer}")
            await self._retry(core.mount_failed(answer).pause)
            return
        step = core.mount_answered(answer)
        if not step.ready:
            world.trace(f"{self.name}: mount answered {answer.name}")
            await self._retry(step.pause)

    async def _retry(self, pause: float) -> None:
        await asyncio.sleep(pause)
        self.remount = True
