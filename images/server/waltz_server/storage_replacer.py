"""Replacing storage nodes lost for good, on the assigner (opt-in: replace_storage_after).

Every probe interval the assigner dials each storage node of the replica assignment (a
handshake, as owners probe a returning replica). A node that fails every probe for
``replace_storage_after`` seconds is replaced, a step at a time
(``waltz_client.cluster.replace_storage``): its partitions take new replicas on the
others, the owners copy them in, and once each has joined a session the lost node gives
the partition up, then leaves the assignment. Every step goes through the replica-safety
checks of ``waltz cluster assign`` and ``remove-storage``.

A replacement recorded in ZooKeeper (by an earlier assigner, or by ``waltz cluster
replace-storage``) is carried on whatever the probes say. An automatic one whose node
answers again before any partition took a new replica is cancelled.

Only the assigner probes; a server that stops being it forgets what it saw, so a new
assigner counts the time from its own probes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial

from waltz_client.cluster.metadata import StorageReplacements
from waltz_client.cluster.replace_storage import (
    ReplacementStep,
    cancel_replacement,
    read_replacements,
    replace_storage_step,
)
from waltz_client.wire.errors import describe

from .coordinator import ServerCoordinator
from .unreachable import UnreachableSince

log = logging.getLogger(__name__)


PROBE_TIMEOUT_FLOOR = 2.0  # seconds a probe waits for the handshake, at least


def probe_interval(after: float) -> float:
    """How often to probe: a quarter of the wait, between 0.5 and 5 s."""
    return min(5.0, max(0.5, after / 4))


@dataclass
class ReplacementView:
    """What the metrics read: each probed node's unreachable time, the replacements under
    way, and the steps taken by this server."""

    unreachable_seconds: dict[str, float] = field(default_factory=dict)
    replacing: set[str] = field(default_factory=set)
    steps: dict[str, int] = field(default_factory=dict)  # action -> count

    def count(self, action: str, n: int = 1) -> None:
        self.steps[action] = self.steps.get(action, 0) + n


class StorageReplacer:
    def __init__(
        self,
        coordinator: ServerCoordinator,
        after: float,
        probe: Callable[[str, float], Awaitable[bool]],
    ) -> None:
        self.coordinator = coordinator
        self.after = after
        self.interval = probe_interval(after)
        self._probe = probe  # (address, timeout) -> answered
        self.tracker = UnreachableSince()
        self.view = ReplacementView()
        self._last_said: dict[str, tuple[str, ...]] = {}  # lost node -> what was logged

    async def run(self) -> None:
        log.info(
            "replacing storage nodes unreachable for %g s (probing every %g s)",
            self.after,
            self.interval,
        )
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.check_once()
            except Exception as e:  # ZooKeeper away, a refused step: the next round retries
                log.warning("replacing storage nodes: %s", describe(e))

    async def check_once(self) -> None:
        c = self.coordinator
        assignment = c.assignment
        if not c.is_assigner or assignment is None:
            self.tracker.clear()
            self.view.unreachable_seconds.clear()
            self.view.replacing.clear()
            return
        nodes = sorted(assignment.storages)
        # At least 2 s to answer: a busy node's TLS handshake must not read as a loss.
        timeout = max(self.interval, PROBE_TIMEOUT_FLOOR)
        answered = await asyncio.gather(*(self._probe(a, timeout) for a in nodes))
        now = asyncio.get_running_loop().time()
        self.tracker.keep_only(nodes)
        for address, ok in zip(nodes, answered, strict=True):
            self.tracker.observe(address, ok, now)
        self.view.unreachable_seconds = {a: self.tracker.seconds(a, now) for a in nodes}
        record, _ = await c.blocking(read_replacements)
        record = await self._cancel_returned(record)
        due = set(self.tracker.due(self.after, now)) | set(record.replacing)
        for lost in sorted(due):
            unusable = (self.tracker.unreachable() | due) - {lost}
            reason = (
                f"unreachable from server {c.registration.server_id} for "
                f"{self.tracker.seconds(lost, now):.0f} s (replace_storage_after "
                f"{self.after:g} s)"
            )
            step = await c.blocking(
                partial(
                    replace_storage_step,
                    lost=lost,
                    unusable=frozenset(unusable),
                    reason=reason,
                    automatic=True,
                )
            )
            self._report(step)
        record, _ = await c.blocking(read_replacements)
        self.view.replacing = set(record.replacing)

    async def _cancel_returned(self, record: StorageReplacements) -> StorageReplacements:
        """Drop automatic replacements of nodes that answer again, before any partition of
        theirs took a new replica; the record as it is after that."""
        returned = [
            lost
            for lost, r in sorted(record.replacing.items())
            if r.automatic and lost in self.tracker.reachable()
        ]
        if not returned:
            return record
        for lost in returned:
            detail = f"{lost} answers again"
            cancelled = await self.coordinator.blocking(
                partial(cancel_replacement, lost=lost, detail=detail)
            )
            if cancelled:
                log.info("storage node %s answers again: its replacement is cancelled", lost)
                self.view.count("cancelled")
                self._last_said.pop(lost, None)
        fresh, _ = await self.coordinator.blocking(read_replacements)
        return fresh

    def _report(self, step: ReplacementStep) -> None:
        plan = step.plan
        if plan is not None:
            for target, partitions in plan.assign.items():
                self.view.count("assigned", len(partitions))
                log.info(
                    "replacing storage node %s: partitions %s get a new replica on %s",
                    step.lost,
                    sorted(partitions),
                    target,
                )
            if plan.unassign:
                self.view.count("unassigned", len(plan.unassign))
                log.info(
                    "replacing storage node %s: it gives up partitions %s (their new replicas "
                    "joined)",
                    step.lost,
                    sorted(plan.unassign),
                )
            waits = tuple(plan.waits())
            if waits != self._last_said.get(step.lost):
                self._last_said[step.lost] = waits
                for line in waits:
                    log.warning("replacing storage node %s: %s", step.lost, line)
        if step.finished:
            self.view.count("removed")
            self._last_said.pop(step.lost, None)
            log.info("storage node %s is replaced: it left the replica assignment", step.lost)
