"""Leader election over a ``coordination.k8s.io`` Lease, as client-go's leaderelection does.

Several operator replicas run; the one holding the Lease reconciles, the others stand by.
The holder renews the Lease every ``retry_period``; a candidate takes it over once it has
seen the same record unchanged for ``lease_duration`` by its own clock (never by the
holder's timestamps: clocks of two nodes may disagree). Every write is an update carrying
the resourceVersion read, so two candidates racing for the Lease cannot both win: the
API server answers 409 to the later one. A leader that cannot renew for
``renew_deadline`` stops leading (the process exits and its pod restarts as a candidate):
by then another replica may hold the Lease, and two leaders must never reconcile at once.

``decide`` is the pure rule; ``LeaderElector`` is the I/O around it.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from waltz_client.runtime.tasks import wait_for

from .kube import ApiError, KubeApi

log = logging.getLogger(__name__)

MICRO_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"


@dataclass(frozen=True)
class LeaseRecord:
    holder: str  # "" : nobody (released)
    lease_duration: float
    transitions: int
    renew_time: str  # as written: a change of it is what "the holder is alive" means


@dataclass(frozen=True)
class Take:
    """Write ourselves as the holder (a new leader: the transitions count goes up)."""

    transitions: int


@dataclass(frozen=True)
class Renew:
    pass


@dataclass(frozen=True)
class Standby:
    holder: str
    expires_in: float  # seconds until we may take it, by our clock


def decide(
    record: LeaseRecord | None,
    identity: str,
    unchanged_for: float,
) -> Take | Renew | Standby:
    """What a candidate does, given the Lease's record (None: no Lease yet) and for how
    long, by its own clock, it has seen that very record."""
    if record is None:
        return Take(transitions=0)
    if record.holder == identity:
        return Renew()
    if not record.holder or unchanged_for >= record.lease_duration:
        return Take(transitions=record.transitions + 1)
    return Standby(record.holder, record.lease_duration - unchanged_for)


def read_record(lease: Mapping[str, Any]) -> LeaseRecord:
    spec = lease.get("spec") or {}
    return LeaseRecord(
        holder=str(spec.get("holderIdentity") or ""),
        lease_duration=float(spec.get("leaseDurationSeconds") or 15),
        transitions=int(spec.get("leaseTransitions") or 0),
        renew_time=str(spec.get("renewTime") or ""),
    )


class LostLeadership(Exception):
    pass


class LeaderElector:
    def __init__(
        self,
        kube: KubeApi,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        if not renew_deadline < lease_duration:
            raise ValueError("the renew deadline must be shorter than the lease duration")
        self.kube = kube
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.clock = clock
        self.wall_clock = wall_clock
        self.leading = False
        self._seen: tuple[LeaseRecord | None, float] | None = None  # record, first seen

    def _unchanged_for(self, record: LeaseRecord | None) -> float:
        now = self.clock()
        if self._seen is None or self._seen[0] != record:
            self._seen = (record, now)
        return now - self._seen[1]

    async def try_acquire_or_renew(self) -> bool:
        """One round: True if we hold the Lease afterwards."""
        lease = await self.kube.get("Lease", self.namespace, self.name)
        record = read_record(lease) if lease is not None else None
        step = decide(record, self.identity, self._unchanged_for(record))
        if isinstance(step, Standby):
            self.leading = False
            return False
        now = self.wall_clock().strftime(MICRO_TIME)
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self.lease_duration),
            "renewTime": now,
        }
        if isinstance(step, Take):
            spec.update(acquireTime=now, leaseTransitions=step.transitions)
        try:
            if lease is None:
                await self.kube.create(
                    {
                        "apiVersion": "coordination.k8s.io/v1",
                        "kind": "Lease",
                        "metadata": {"name": self.name, "namespace": self.namespace},
                        "spec": spec,
                    }
                )
            else:
                # An update with the resourceVersion read: a racing write makes it a 409.
                await self.kube.replace(
                    {**lease, "spec": {**(lease.get("spec") or {}), **spec}},
                )
        except ApiError as e:
            if e.status != 409:
                raise
            log.info("lease %s/%s: another candidate wrote first", self.namespace, self.name)
            self.leading = False
            return False
        if isinstance(step, Take):
            log.info("lease %s/%s: %s leads now", self.namespace, self.name, self.identity)
        self.leading = True
        return True

    async def acquire(self) -> None:
        """Stand by until we lead."""
        while True:
            try:
                if await self.try_acquire_or_renew():
                    return
            except Exception as e:  # the API is unreachable: keep standing by
                log.warning("lease %s/%s: %s", self.namespace, self.name, e)
            await asyncio.sleep(self.retry_period)

    async def hold(self) -> None:
        """Renew until it fails for ``renew_deadline``; then raise LostLeadership."""
        last_renewed = self.clock()
        while True:
            await asyncio.sleep(self.retry_period)
            try:
                renewed = await wait_for(self.try_acquire_or_renew(), timeout=self.renew_deadline)
            except Exception as e:
                log.warning("lease %s/%s: renewal failed: %s", self.namespace, self.name, e)
                renewed = False
            if renewed:
                last_renewed = self.clock()
            elif not self.leading or self.clock() - last_renewed >= self.renew_deadline:
                self.leading = False
                raise LostLeadership(
                    f"lost the lease {self.namespace}/{self.name}: not renewed for "
                    f"{self.clock() - last_renewed:.0f} s"
                )

    async def release(self) -> None:
        """Give the Lease up at a clean shutdown, so a standby takes over at once."""
        if not self.leading:
            return
        self.leading = False
        try:
            lease = await self.kube.get("Lease", self.namespace, self.name)
            if lease is None or read_record(lease).holder != self.identity:
                return
            spec = {**(lease.get("spec") or {}), "holderIdentity": "", "leaseDurationSeconds": 1}
            await self.kube.replace({**lease, "spec": spec})
        except Exception as e:  # it expires by itself
            log.warning("lease %s/%s: not released: %s", self.namespace, self.name, e)
