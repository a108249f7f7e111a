"""The operator's liveness: alive means reconciles keep finishing.

A process can serve HTTP while its reconciles are stuck (a ZooKeeper or API call that
never returns, a lock never released): Kubernetes should restart it then, and only then.
A reconcile that has been under way (or waiting for the one before it) for longer than
``stall_after`` seconds means the operator is stuck. A reconcile that fails finishes: a
failure is reported in the resource's status, not by a restart. A standby replica
(leader election) reconciles nothing and is alive while it waits.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class ReconcileProgress:
    def __init__(self, stall_after: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.stall_after = stall_after
        self.clock = clock
        self.role = "standalone"  # or "leader", "standby"
        self._under_way: dict[int, tuple[str, float]] = {}  # token -> cluster, since
        self._next = 0

    def started(self, cluster: str) -> int:
        """A reconcile began (or queued behind another); the token ends it."""
        self._next += 1
        self._under_way[self._next] = (cluster, self.clock())
        return self._next

    def finished(self, token: int) -> None:
        """It ended, well or with an error."""
        self._under_way.pop(token, None)

    def stalled(self) -> list[str]:
        now = self.clock()
        return sorted(
            {c for c, since in self._under_way.values() if now - since > self.stall_after}
        )

    def report(self) -> tuple[bool, dict[str, Any]]:
        """(alive, the /healthz body)."""
        stalled = self.stalled()
        body: dict[str, Any] = {"status": "stalled" if stalled else "ok", "role": self.role}
        if stalled:
            body["stalled"] = stalled
            body["message"] = (
                f"a reconcile of {', '.join(stalled)} has not finished in {self.stall_after:g} s"
            )
        return not stalled, body
