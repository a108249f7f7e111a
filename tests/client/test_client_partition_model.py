"""ClientPartition against a model server, under any interleaving hypothesis draws.

The model server holds one partition's committed log and this client's appends not yet
decided, in the order they were sent; it decides them in that order (commit or drop,
or refuse on a lock), feeds each mount its rows in order (sometimes again from a little
earlier, as overlaps at a mount's start do, sometimes with a row missing, as a broken
server would), answers a Mount or Flush only behind the rows it covers, and keeps
feeding older mounts too (their connections still deliver). The client side is what
the client library's shell does with the core's answers, including an application
whose ``apply_transaction`` fails. After every step:

- the delivered transactions are exactly 0, 1, 2, ... each as the log has it: none
  twice, none skipped, none out of order, whatever the feeds and remounts did;
- every settled append was settled at most once and truly: committed as the ID the log
  holds it at; lost or lock-failed only when the server dropped or refused it (so
  executing the context again cannot commit it twice).
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from waltz_client.client_partition import ClientPartition, MountPhase
from waltz_client.monitor import Outcome, Resolution
from waltz_client.wire.client_messages import (
    FlushResponse,
    LockFailure,
    MountResponse,
    MountStatus,
)
from waltz_client.wire.records import ReqId

ME = 7
OTHER = 8
P = 0


class ClientAgainstModelServer(RuleBasedStateMachine):
    @initialize(applies=st.booleans())
    def start(self, applies: bool) -> None:
        self.core: ClientPartition[int] = ClientPartition(P, applies, 0.05)
        self.seq = 0
        self.generation = 1
        # The server's truth.
        self.log: list[ReqId] = []
        self.undecided: list[ReqId] = []  # this client's appends, in send order
        self.dropped: set[ReqId] = set()
        self.feeds: dict[ReqId, int] = {}  # mount -> the next log position it sends
        self.flushes: list[tuple[ReqId, ReqId]] = []  # (flush, the mount it was sent on)
        # The client's record.
        self.delivered: list[tuple[int, ReqId]] = []
        self.sent: dict[int, ReqId] = {}  # item -> its request
        self.settled: dict[int, Resolution[int]] = {}
        self.remount_due = False
        self.remount()

    # --- the client's side --------------------------------------------------------------

    def next_req(self) -> ReqId:
        self.seq += 1
        return ReqId(ME, self.generation, P, self.seq)

    def settle(self, resolutions: list[Resolution[int]]) -> None:
        for r in resolutions:
            assert r.item not in self.settled, f"{r.item} settled twice"
            self.settled[r.item] = r

    def take(self, mount: ReqId, rows: list[tuple[int, ReqId]], fail_at: int | None) -> None:
        """A feed message, as the shell handles it (watched, or applied one row at a
        time with ``apply_transaction`` raising at ``fail_at``)."""
        core = self.core
        if not core.applies:
            packed = [(t, q.client_id, q.generation, q.partition_id, q.seq, 0, t) for t, q in rows]
            before = core.applied
            taken = core.take_feed(mount, packed, ME)
            self.settle(taken.settled)
            self.delivered += [(t, q) for t, q in rows if before < t <= core.applied]
            if taken.gap is not None:
                self.remount_due = True
            return
        if not core.is_current_feed(mount):
            return
        packed = [(t, q.client_id, q.generation, q.partition_id, q.seq, 0, t) for t, q in rows]
        span = core.deliverable(packed)
        for i in range(span.start, span.stop):
            txid, q = rows[i]
            resolutions = core.commit_seen(q, txid)
            if i == fail_at:
                self.settle(resolutions)
                if core.feed_stopped(mount):
                    self.remount_due = True
                return
            core.delivered(txid)
            self.delivered.append((txid, q))
            self.settle(resolutions)
        if span.gap is not None:
            core.feed_stopped(mount)
            self.remount_due = True

    def feed_to_end(self, mount: ReqId) -> None:
        start = self.feeds[mount]
        self.feeds[mount] = len(self.log)
        self.take(mount, list(enumerate(self.log))[start:], None)

    def decide_all(self, commits: list[bool]) -> None:
        """The server decides every append sent so far, in order (behind a barrier)."""
        for i, q in enumerate(self.undecided):
            if commits[i % len(commits)]:
                self.log.append(q)
            else:
                self.dropped.add(q)
        self.undecided.clear()

    # --- rules --------------------------------------------------------------------------

    @rule()
    def remount(self) -> None:
        """The mount loop: block appends, mount at the client high-water mark (the
        application's: what it was delivered)."""
        self.core.remounting()
        self.generation += self.seq % 2  # sometimes at a new owner
        q = self.next_req()
        self.core.mount_sent(q, self.core.applied)
        self.feeds[q] = self.core.applied + 1
        self.remount_due = False

    @precondition(lambda self: self.core.phase is MountPhase.MOUNTING)
    @rule(ready=st.booleans(), commits=st.lists(st.booleans(), min_size=1, max_size=4))
    def answer_mount(self, ready: bool, commits: list[bool]) -> None:
        mount = self.core.mount_req
        assert mount is not None
        if ready:
            self.decide_all(commits)
            self.feed_to_end(mount)
        status = MountStatus.READY if ready else MountStatus.NOT_OWNER
        reaction = self.core.receive(MountResponse(mount, status))
        assert reaction.mount_status == status
        self.settle(reaction.settled)

    @precondition(lambda self: self.core.phase is MountPhase.MOUNTED and not self.remount_due)
    @rule()
    def append(self) -> None:
        q = self.next_req()
        q = ReqId(ME, self.core.generation, P, q.seq)
        self.sent[q.seq] = q
        self.core.monitor.sent(q, q.seq)
        self.undecided.append(q)

    @precondition(lambda self: self.undecided)
    @rule(commit=st.booleans())
    def server_decides_one(self, commit: bool) -> None:
        q = self.undecided.pop(0)
        if commit:
            self.log.append(q)
        else:
            self.dropped.add(q)

    @precondition(lambda self: self.undecided)
    @rule()
    def lock_failure(self) -> None:
        q = self.undecided.pop(0)
        self.dropped.add(q)
        self.settle(self.core.receive(LockFailure(q, len(self.log) - 1)).settled)

    @rule()
    def another_client_commits(self) -> None:
        self.log.append(ReqId(OTHER, self.generation, P, len(self.log)))

    @rule(
        which=st.integers(0, 5),
        count=st.integers(1, 4),
        back=st.integers(0, 2),
        fail_at=st.none() | st.integers(0, 3),
    )
    def feed(self, which: int, count: int, back: int, fail_at: int | None) -> None:
        mounts = list(self.feeds)
        mount = mounts[-1 - which % len(mounts)]  # mostly the newest mount
        start = max(0, self.feeds[mount] - back)
        rows = list(enumerate(self.log))[start : start + count]
        self.feeds[mount] = max(self.feeds[mount], start + len(rows))
        self.take(mount, rows, fail_at)

    @rule(which=st.integers(0, 2))
    def feed_with_a_hole(self, which: int) -> None:
        mounts = list(self.feeds)
        mount = mounts[-1 - which % len(mounts)]
        position = self.feeds[mount]
        if position + 1 < len(self.log):
            self.take(mount, [(position + 1, self.log[position + 1])], None)

    @precondition(lambda self: self.core.phase is MountPhase.MOUNTED)
    @rule()
    def flush(self) -> None:
        q = self.next_req()
        self.core.flush_sent(q)
        assert self.core.mount_req is not None
        self.flushes.append((q, self.core.mount_req))

    @precondition(lambda self: self.flushes)
    @rule(commits=st.lists(st.booleans(), min_size=1, max_size=4))
    def answer_flush(self, commits: list[bool]) -> None:
        q, mount = self.flushes.pop(0)
        self.decide_all(commits)
        self.feed_to_end(mount)  # the answer comes behind what it covers, on its feed
        reaction = self.core.receive(FlushResponse(q, len(self.log) - 1))
        assert reaction.flush == q
        self.settle(reaction.settled)

    # --- what must hold -----------------------------------------------------------------

    @invariant()
    def delivered_in_order_once_each(self) -> None:
        if not hasattr(self, "core"):
            return
        assert [t for t, _ in self.delivered] == list(range(len(self.delivered)))
        assert all(self.log[t] == q for t, q in self.delivered)
        assert self.core.applied == len(self.delivered) - 1

    @invariant()
    def settled_truly(self) -> None:
        if not hasattr(self, "core"):
            return
        committed_at = {q: t for t, q in enumerate(self.log)}
        for item, r in self.settled.items():
            q = self.sent[item]
            if r.outcome == Outcome.COMMITTED:
                assert committed_at.get(q) == r.transaction_id, (q, r)
            else:
                assert q in self.dropped, f"{q} settled {r.outcome.value} but not dropped"
                assert q not in committed_at


TestClientAgainstModelServer = ClientAgainstModelServer.TestCase
TestClientAgainstModelServer.settings = settings(
    max_examples=600, stateful_step_count=60, deadline=None
)
