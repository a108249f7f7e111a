"""When a running store session should end at a planned boundary, pure.

A partition's store session runs until it fails or a planned boundary ends it: the
checkpoint interval (so that the next recovery has little to resolve), a new replica set,
a lagging replica caught up, or an assigned replica missing from the session that answers
again (the next session includes it). The asyncio shell (``partition.py``) does the
waiting, the pings and the probes; the rules are here, with the clock passed in.

Probing a returning replica backs off per replica: a node that answers but cannot join
(a corrupt partition, a wrong cluster key) would otherwise end the session on every
probe, and every new session resets the lock table.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Sequence

MAX_REJOIN_BACKOFF = 60.0  # seconds between probes of a replica that keeps failing to join


def missing_replicas(
    replicas: Sequence[str], members: Container[str], copying: Container[str]
) -> list[str]:
    """The assigned replicas worth probing, in assignment order: not members of the
    session, and not being copied now (``copying``; a copy that failed is tried again by
    the next session)."""
    return [a for a in replicas if a not in members and a not in copying]


def checkpoint_reached(high_water_mark: int, start_high_water_mark: int, interval: int) -> bool:
    """Whether the session committed ``interval`` transactions since it started."""
    return high_water_mark - start_high_water_mark >= interval


def rejoin_backoff(probe_interval: float, attempts: int) -> float:
    """Seconds before a replica that answered ``attempts`` times without staying in a
    session is probed again: doubling from the probe interval, capped."""
    return min(MAX_REJOIN_BACKOFF, probe_interval * float(2**attempts))


class RejoinProbes:
    """When each missing replica is probed next, and how often it came back already."""

    def __init__(self, probe_interval: float) -> None:
        self.probe_interval = probe_interval
        self._attempts: dict[str, int] = {}  # sessions ended for a returning replica
        self._next_probe: dict[str, float] = {}

    def joined(self, members: Iterable[str]) -> None:
        """A session started with ``members``: their next return backs off from the start
        again (the next probe time stands: it is past by the time one leaves)."""
        for address in members:
            self._attempts.pop(address, None)

    def attempts(self, address: str) -> int:
        return self._attempts.get(address, 0)

    def due(self, address: str, now: float) -> bool:
        """Whether ``address`` may be probed at ``now``."""
        return now >= self._next_probe.get(address, 0.0)

    def reachable_again(self, address: str, now: float) -> str:
        """``address`` answered the probe started at ``now``: the session ends so that the
        next one includes it; the reason. Its next probe waits longer."""
        attempts = self.attempts(address) + 1
        self._attempts[address] = attempts
        self._next_probe[address] = now + rejoin_backoff(self.probe_interval, attempts)
        return f"replica {address} is reachable again"
