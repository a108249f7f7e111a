"""``waltz bench --scale failover``: how long each partition goes without commits when
the server owning it goes away, killed or stopped.

Each scenario runs on a fresh cluster (3 storage nodes, TWO servers, the partitions
given; mutual TLS unless ``--insecure``; the servers' ZooKeeper session timeout
``--scale-session-timeout``, which the local ZooKeeper grants as asked). A writer, one
``WaltzClient``, keeps every partition committing: C writes in flight in all, spread
evenly over the partitions (at least one each). A commit's time is the writer's, when
``submit`` returns committed: what an application sees, the client library's remounts
and retries included.

* kill: after ``--seconds`` of load, the owner of partition 0 gets SIGKILL. Its
  partitions move once its ZooKeeper session expires. For each partition, the gap from
  its last commit before the kill to its first after; reported over the partitions the
  killed server owned (the longest and the median), the longest of the others, and the
  time from the kill until every partition had committed again. The goal: within the
  session timeout + 2 s.
* rolling restart: after ``--seconds`` of load, each server in turn gets SIGTERM (what
  ``waltz local``, systemd and Kubernetes send) and, once every partition has committed
  after it exited, is started again; the next goes once it owns its share again and
  every partition has committed after that. On SIGTERM a server hands its partitions
  over (docs/server.md, "A planned stop"): one ZooKeeper transaction gives them to the
  other server while it still serves them, and the other recovers them from the storage
  nodes. A server that comes back opens its storage connections, registers, and gets its
  share from the assigner: the partitions' owner stops serving them when the ownership
  changes, their new owner recovers them. For each partition, the longest time without a commit from
  the first SIGTERM until the last server is back; and each step's longest over all
  partitions. The goal: at most 100 ms.
"""

from __future__ import annotations

import asyncio
import bisect
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from waltz_client.client import SubmitStatus, WaltzClient
from waltz_client.cluster.metadata import Ownership
from waltz_client.cluster.paths import ClusterPaths
from waltz_client.cluster.zk import close
from waltz_client.config import WaltzClientConfig
from waltz_client.runtime import event_loop

from .common import Put, fresh_cluster
from .scale_settings import record

if TYPE_CHECKING:
    from kazoo.client import KazooClient

    from waltz_client.tools.local.cluster import LocalCluster

    from .scale_settings import ScaleSettings

SERVERS = 2
SETTLE = 1.0  # after an ownership change: commits after this are the new owner's
AFTER = 0.5  # of load kept after the last partition is back
WAIT_BEYOND_TIMEOUT = 60.0  # how long past the session timeout a partition may stay away


# --- gaps (pure) ------------------------------------------------------------------------


def gap_across(times: list[float], at: float) -> tuple[float, float] | None:
    """Of sorted commit ``times`` around the event at ``at``: (the gap from the last
    commit at or before ``at`` to the first after it, the time from ``at`` to that
    first one); None when none came after. Without a commit before, the gap starts at
    ``at``."""
    i = bisect.bisect_right(times, at)
    if i == len(times):
        return None
    first = times[i]
    last = times[i - 1] if i else at
    return first - last, first - at


def outage_across(times: list[float], at: float) -> tuple[float, float] | None:
    """``gap_across`` for a partition the event stopped: the longest gap between commits
    that ends after ``at``, and the time from ``at`` to the commit that ends it. The
    longest, not the first: answers already on their way when the owner died are read
    after ``at``, and would otherwise pass for the new owner's."""
    i = bisect.bisect_right(times, at)
    if i == len(times):
        return None
    previous = times[i - 1] if i else at
    gap, end = -1.0, at
    for t in times[i:]:
        if t - previous > gap:
            gap, end = t - previous, t
        previous = t
    return gap, end - at


def longest_gap(times: list[float], start: float, end: float) -> float:
    """The longest time without a commit across [``start``, ``end``] of sorted commit
    ``times``: from the last commit at or before ``start`` (or ``start``) through each
    commit within, to ``end``."""
    i = bisect.bisect_right(times, start)
    previous = times[i - 1] if i else start
    longest = 0.0
    for t in times[i:]:
        if t > end:
            break
        longest = max(longest, t - previous)
        previous = t
    return max(longest, end - previous)


def per_partition(concurrency: int, partitions: int) -> int:
    """Writes in flight on each partition: ``concurrency`` spread evenly, at least 1."""
    return max(1, concurrency // partitions)


def _ms(seconds: float | None) -> str:
    return "none" if seconds is None else f"{seconds * 1000:,.0f}"


def _s(seconds: float | None) -> str:
    return "none" if seconds is None else f"{seconds:.2f}"


# --- the writer -------------------------------------------------------------------------


class Writer:
    """Keeps ``each`` writes in flight on every partition; the times of their commits."""

    def __init__(self, client: WaltzClient, partitions: int, each: int, size: int) -> None:
        self.client = client
        self.partitions = partitions
        self.each = each
        self.size = size
        self.commits: list[list[float]] = [[] for _ in range(partitions)]
        self.failed = 0
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Every partition mounted (a first write each), then the load."""
        await asyncio.gather(
            *(self.client.submit(Put(p, b"warm-up")) for p in range(self.partitions))
        )
        payload = os.urandom(self.size)
        self._tasks = [
            asyncio.ensure_future(self._slot(p, payload))
            for p in range(self.partitions)
            for _ in range(self.each)
        ]

    async def _slot(self, partition: int, payload: bytes) -> None:
        while not self._stopping:
            r = await self.client.submit(Put(partition, payload))
            if r.status == SubmitStatus.COMMITTED:
                self.commits[partition].append(time.monotonic())
            else:
                self.failed += 1
                await asyncio.sleep(0.01)

    def committed_after(self, at: float) -> bool:
        return all(c and c[-1] > at for c in self.commits)

    async def until_committed_after(self, at: float, timeout: float) -> bool:
        """Until every partition has committed after ``at`` (True) or ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while not self.committed_after(at):
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    @property
    def writes(self) -> int:
        return sum(len(c) for c in self.commits)

    async def stop(self) -> None:
        self._stopping = True
        _, pending = await asyncio.wait(self._tasks, timeout=30)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


def _config(cluster: LocalCluster, each: int) -> WaltzClientConfig:
    return WaltzClientConfig(
        cluster.zookeeper_connect,
        zk_root=cluster.layout.root,
        feed=False,
        max_outstanding_appends=each,
        max_retries=1000,
        transaction_timeout=None,  # keep trying through the outage measured
        tls=cluster.client_tls,
        zk_tls=cluster.client_zk_tls,
    )


def _cluster(s: ScaleSettings, partitions: int) -> LocalCluster:
    timeout = ["--zk-session-timeout", f"{s.session_timeout:g}"]
    return fresh_cluster(s.data_dir, partitions, SERVERS, timeout, tls=s.tls)


# --- the kill ---------------------------------------------------------------------------


@dataclass
class KillCell:
    partitions: int
    each: int  # writes in flight on each partition
    session_timeout: float
    tls: bool
    killed: str
    moved: list[int]  # the partitions the killed server owned
    # Per partition: from its last commit before the kill to its first after, and from
    # the kill to that first commit (None: none within the wait).
    gaps_s: list[float | None]
    back_s: list[float | None]
    waited_s: float  # how long the partitions were waited for
    writes: int
    # From the kill until the ownership node in ZooKeeper gives none of the partitions to
    # the killed server (its session expired, the other server rebalanced); None: not
    # within the wait. The rest of a gap is recovery and the client's remount.
    ownership_moved_s: float | None = None
    run: int = 0

    @property
    def moved_gaps(self) -> list[float | None]:
        return [self.gaps_s[p] for p in self.moved]

    @property
    def moved_max_s(self) -> float | None:
        gaps = self.moved_gaps
        return None if not gaps or None in gaps else max(g for g in gaps if g is not None)

    @property
    def moved_median_s(self) -> float | None:
        known = sorted(g for g in self.moved_gaps if g is not None)
        if not known or len(known) * 2 <= len(self.moved):  # half or more never came back
            return None
        return statistics.median(known + [float("inf")] * (len(self.moved) - len(known)))

    @property
    def others_max_s(self) -> float | None:
        others = [g for p, g in enumerate(self.gaps_s) if p not in self.moved]
        if not others:
            return 0.0
        return None if None in others else max(g for g in others if g is not None)

    @property
    def all_back_s(self) -> float | None:
        return None if None in self.back_s else max(b for b in self.back_s if b is not None)

    @property
    def goal_s(self) -> float:
        return self.session_timeout + 2.0


def _ownership_moved(zk: KazooClient, root: str, victim: str, timeout: float) -> float | None:
    """When (monotonic) the ownership node first gives every partition to a server other
    than ``victim``, read every 20 ms; None if not within ``timeout`` s."""
    path = ClusterPaths.of(root).ownership
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        data, _ = zk.get(path)
        owners = Ownership.decode(data).partitions.values()
        if all(owner is not None and owner != victim for owner, _ in owners):
            return time.monotonic()
        time.sleep(0.02)
    return None


async def _kill(cluster: LocalCluster, s: ScaleSettings, partitions: int, each: int) -> KillCell:
    wait = s.session_timeout + WAIT_BEYOND_TIMEOUT
    zk = await asyncio.to_thread(cluster.zk_connect)
    try:
        async with WaltzClient(_config(cluster, each)) as client:
            writer = Writer(client, partitions, each, s.size)
            await writer.start()
            await asyncio.sleep(s.seconds)
            owners = await asyncio.to_thread(cluster.ownership)
            victim = owners[0][0] or "server-0"
            moved = sorted(p for p, (owner, _) in owners.items() if owner == victim)
            killed_at = time.monotonic()
            cluster.servers[int(victim.rsplit("-", 1)[1])].kill()
            root = cluster.layout.root
            watching = asyncio.ensure_future(
                asyncio.to_thread(_ownership_moved, zk, root, victim, wait)
            )
            await writer.until_committed_after(killed_at, wait)
            await asyncio.sleep(AFTER)
            await writer.stop()
            moved_at = await watching
    finally:
        await asyncio.to_thread(close, zk)
    across = [
        (outage_across if p in moved else gap_across)(c, killed_at)
        for p, c in enumerate(writer.commits)
    ]
    return KillCell(
        partitions,
        each,
        s.session_timeout,
        s.tls,
        victim,
        moved,
        [a[0] if a else None for a in across],
        [a[1] if a else None for a in across],
        wait,
        writer.writes,
        None if moved_at is None else moved_at - killed_at,
    )


def describe_kill(cell: KillCell) -> str:
    return (
        f"run {cell.run + 1}: {cell.partitions} partitions, {cell.each} in flight each, "
        f"{cell.killed} SIGKILLed (it owned {len(cell.moved)}): the longest gap "
        f"{_s(cell.moved_max_s)} s (median {_s(cell.moved_median_s)} s), the other "
        f"partitions' longest {_s(cell.others_max_s)} s; ownership moved in ZooKeeper "
        f"{_s(cell.ownership_moved_s)} s and every partition back {_s(cell.all_back_s)} s "
        f"after the kill (session timeout {cell.session_timeout:g} s; goal {cell.goal_s:g} s)"
    )


def kill_table(cells: list[KillCell]) -> str:
    head = [
        "partitions", "in flight each", "session timeout s", "moved",
        "moved: longest gap s", "moved: median gap s", "others: longest gap s",
        "ownership moved after s", "all back after the kill s", "goal s",
    ]  # fmt: skip
    rows = [head, ["---:"] * len(head)]
    for key in dict.fromkeys((c.partitions, c.each) for c in cells):
        mine = sorted(
            (c for c in cells if (c.partitions, c.each) == key),
            key=lambda c: float("inf") if c.all_back_s is None else c.all_back_s,
        )
        cell = mine[len(mine) // 2]
        p = cell.partitions
        rows.append(
            [
                str(p),
                str(cell.each),
                f"{cell.session_timeout:g}",
                f"{len(cell.moved)} of {p}",
                _s(cell.moved_max_s),
                _s(cell.moved_median_s),
                _s(cell.others_max_s),
                _s(cell.ownership_moved_s),
                _s(cell.all_back_s),
                f"{cell.goal_s:g}",
            ]
        )
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


# --- the rolling restart ----------------------------------------------------------------


@dataclass
class Step:
    what: str
    started_s: float  # from the first SIGTERM
    ended_s: float
    complete: bool = True  # every partition committed after it within the wait
    longest_gap_s: float = 0.0  # over all partitions, within the step


@dataclass
class RollCell:
    partitions: int
    each: int
    session_timeout: float
    tls: bool
    steps: list[Step] = field(default_factory=list)
    longest_gap_s: list[float] = field(default_factory=list)  # per partition, whole restart
    writes: int = 0
    run: int = 0

    @property
    def max_s(self) -> float:
        return max(self.longest_gap_s)

    @property
    def median_s(self) -> float:
        return statistics.median(self.longest_gap_s)


def _owns_share(cluster: LocalCluster, index: int, partitions: int, timeout: float) -> bool:
    """Until ``server-<index>`` owns its share of the partitions again (True), or
    ``timeout`` s (False)."""
    wanted = partitions // SERVERS
    deadline = time.monotonic() + timeout
    while True:
        owners = cluster.ownership()
        if sum(owner == f"server-{index}" for owner, _ in owners.values()) >= wanted:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


async def _roll(cluster: LocalCluster, s: ScaleSettings, partitions: int, each: int) -> RollCell:
    cell = RollCell(partitions, each, s.session_timeout, s.tls)
    wait = s.session_timeout + WAIT_BEYOND_TIMEOUT
    spans: list[tuple[float, float]] = []
    async with WaltzClient(_config(cluster, each)) as client:
        writer = Writer(client, partitions, each, s.size)
        await writer.start()
        await asyncio.sleep(s.seconds)
        began = time.monotonic()
        for i, server in enumerate(cluster.servers):
            start = time.monotonic()
            await asyncio.to_thread(server.stop)
            ok = await writer.until_committed_after(time.monotonic(), wait)
            end = time.monotonic()
            cell.steps.append(Step(f"SIGTERM server-{i}", start - began, end - began, ok))
            spans.append((start, end))
            start = time.monotonic()
            await asyncio.to_thread(server.start)
            ok = await asyncio.to_thread(_owns_share, cluster, i, partitions, wait)
            seen = time.monotonic()
            ok = await writer.until_committed_after(seen + SETTLE, wait) and ok
            end = time.monotonic()
            cell.steps.append(Step(f"server-{i} back", start - began, end - began, ok))
            spans.append((start, end))
        ended = time.monotonic()
        await asyncio.sleep(AFTER)
        await writer.stop()
    cell.longest_gap_s = [longest_gap(c, began, ended) for c in writer.commits]
    for step, (start, end) in zip(cell.steps, spans, strict=True):
        step.longest_gap_s = max(longest_gap(c, start, end) for c in writer.commits)
    cell.writes = writer.writes
    return cell


def describe_roll(cell: RollCell) -> str:
    steps = ", ".join(
        f"{st.what} {_ms(st.longest_gap_s)} ms" + ("" if st.complete else " (not all back)")
        for st in cell.steps
    )
    return (
        f"run {cell.run + 1}: {cell.partitions} partitions, {cell.each} in flight each, "
        f"rolling restart: the longest time without commits {_ms(cell.max_s)} ms (median "
        f"over the partitions {_ms(cell.median_s)} ms); each step's longest: {steps}"
    )


def roll_table(cells: list[RollCell]) -> str:
    names = [st.what for st in cells[0].steps] if cells else []
    head = [
        "partitions", "in flight each", "longest gap ms: max", "median",
        *(f"{name} ms" for name in names),
    ]  # fmt: skip
    rows = [head, ["---:"] * len(head)]
    for key in dict.fromkeys((c.partitions, c.each) for c in cells):
        mine = sorted((c for c in cells if (c.partitions, c.each) == key), key=lambda c: c.max_s)
        cell = mine[len(mine) // 2]
        rows.append(
            [
                str(cell.partitions),
                str(cell.each),
                _ms(cell.max_s),
                _ms(cell.median_s),
                *(
                    _ms(st.longest_gap_s) + ("" if st.complete else " (not all back)")
                    for st in cell.steps
                ),
            ]
        )
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


# --- the mode ---------------------------------------------------------------------------


def _scenario(s: ScaleSettings, partitions: int, each: int, scenario: Callable[..., Any]) -> Any:
    cluster = _cluster(s, partitions)
    cluster.start()
    try:
        return event_loop.run(scenario(cluster, s, partitions, each))
    finally:
        cluster.stop()


def run(s: ScaleSettings, say: Callable[[str], None]) -> list[dict[str, Any]]:
    say(
        f"{','.join(map(str, s.partitions))} partitions on {SERVERS} servers, "
        f"{'mutual TLS' if s.tls else 'plain text'}, ZooKeeper session timeout "
        f"{s.session_timeout:g} s (the servers' --zk-session-timeout), "
        f"{','.join(map(str, s.concurrency))} writes in flight in all, spread over the "
        "partitions (at least 1 each), "
        f"{s.size}-byte writes, {s.seconds:g} s of load before each event, {s.runs} run(s); "
        "a commit's time is when the writer's submit returns"
    )
    kills: list[KillCell] = []
    rolls: list[RollCell] = []
    for r in range(s.runs):
        for p in s.partitions:
            for c in s.concurrency:
                each = per_partition(c, p)
                kill: KillCell = _scenario(s, p, each, _kill)
                kill.run = r
                kills.append(kill)
                say(describe_kill(kill))
                roll: RollCell = _scenario(s, p, each, _roll)
                roll.run = r
                rolls.append(roll)
                say(describe_roll(roll))
    say("")
    say(
        f"the owner SIGKILLed, median of {s.runs} run(s) (by the time until all are back); "
        "a gap: a partition's last commit before the kill to its first after; issue 43's "
        "goal: every partition within the session timeout + 2 s"
    )
    say(kill_table(kills))
    say("")
    say(
        f"a rolling restart (SIGTERM, then start, each server in turn), median of "
        f"{s.runs} run(s) (by the longest gap); a gap: the longest time a partition went "
        "without commits; issue 43's goal: at most 100 ms (a stopped server hands its "
        "partitions over; their new owner recovers them)"
    )
    say(roll_table(rolls))
    return [
        *(
            record(
                c,
                scenario="kill",
                moved_max_s=c.moved_max_s,
                moved_median_s=c.moved_median_s,
                others_max_s=c.others_max_s,
                all_back_s=c.all_back_s,
            )
            for c in kills
        ),
        *(record(c, scenario="rolling restart", max_s=c.max_s, median_s=c.median_s) for c in rolls),
    ]
