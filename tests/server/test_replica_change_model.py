"""A model of one partition whose replica set changes while its sessions crash.

Random sequences of replica additions and removals (each through the admin check
``replica_change_problem``, as `waltz cluster` and the operator apply them), store
sessions that recover through the server's pure decisions (``decide``, ``plan_replica``,
``pick_source``, ``closing_metadata``) with random storage nodes down and crashes at any
recovery step, appends reaching random prefixes of the members, and storage nodes
decommissioned for good (their data gone) as soon as nothing needs them: no longer
assigned, and not a member of the last writing session (``still_needed``, which is also
what keeps a storage node serving a partition it lost in the assignment).

After every session: nothing committed is lost, nothing uncommitted is decided, no
replica forks. At the end, with every remaining storage node up, recovery must decide
(the partition is never wedged) and every replica must hold exactly the committed log.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_model import Storage

from waltz_client.cluster.metadata import PartitionMetadata
from waltz_client.cluster.replica_safety import (
    replica_change_problem,
    still_needed,
    writing_members,
)
from waltz_server.recovery import (
    closing_metadata,
    decide,
    pick_source,
    plan_replica,
)
from waltz_server.recovery_vote import Undecidable, majority

NODES = ("a", "b", "c", "d", "e")
GENERATION = 1


@dataclass
class Partition:
    assignment: set[str] = field(default_factory=lambda: {"a", "b", "c"})
    storages: dict[str, Storage] = field(default_factory=lambda: {n: Storage() for n in NODES})
    gone: set[str] = field(default_factory=set)  # decommissioned: data lost for good
    metadata: PartitionMetadata = field(default_factory=PartitionMetadata)
    committed: list[tuple[int, int]] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)

    # --- operations -----------------------------------------------------------------

    def change(self, new: set[str]) -> None:
        problem = replica_change_problem(0, self.metadata, new)
        self.trace.append(f"assign {sorted(new)}: {'refused' if problem else 'done'}")
        if problem is None:
            self.assignment = set(new)
            for node in new & self.gone:  # a returning address gets a fresh, empty disk
                self.gone.discard(node)
                self.storages[node] = Storage()

    def decommission(self, node: str) -> None:
        if node in self.assignment or still_needed(self.metadata, node) or node in self.gone:
            return
        self.trace.append(f"decommission {node}")
        self.gone.add(node)
        self.storages[node] = Storage(log=[(-1, -1)] * 99)  # garbage nobody may read

    def session(self, up: set[str], crash_after: int | None, appends: int, prefix: dict) -> bool:
        """One store session as recovery_manager runs it; False if it did not open."""
        self.metadata = replace(
            self.metadata, generation=GENERATION, session_id=self.metadata.session_id + 1
        )
        session_id = self.metadata.session_id
        replicas = sorted(self.assignment)
        dial = [*replicas, *sorted(writing_members(self.metadata) - set(replicas))]
        reachable = [r for r in dial if r in up and r not in self.gone]
        views = {r: self.storages[r].view() for r in reachable}
        assessments, decision = decide(self.metadata, replicas, views)
        self.trace.append(
            f"session {session_id}: replicas {replicas}, reachable {reachable}: {decision}"
        )
        if isinstance(decision, Undecidable):
            return False
        decided = decision.high_water_mark
        assert decided >= len(self.committed) - 1, "a committed transaction would be lost"
        assert decided <= len(self.committed) - 1, "an uncommitted transaction is decided"

        budget = crash_after

        def spend() -> bool:
            nonlocal budget
            if budget is None:
                return True
            budget -= 1
            return budget >= 0

        for r, a in assessments.items():
            if r in replicas and a.truncate_to is not None:
                if not spend():
                    return False
                self.storages[r].truncate(a.truncate_to)
        positions = {r: a.vote for r, a in assessments.items()}
        votes = dict(positions)
        members = []
        for r in reachable:
            if r not in replicas:
                continue  # a removed voter only votes
            if not spend():
                return False
            s = self.storages[r]
            plan = plan_replica(positions[r], decided)
            if plan.truncate_to is not None:
                s.truncate(plan.truncate_to)
            if plan.catch_up_from is not None:
                source = self.storages[pick_source(positions, votes, decided)]
                s.log.extend(source.log[plan.catch_up_from : decided + 1])
            assert s.log == self.committed[: decided + 1], f"{r} forks from the committed log"
            s.set_low_water_mark(session_id, decided)
            members.append(r)
        quorum = majority(len(replicas))
        if len(members) < quorum or not spend():
            return False
        self.metadata = closing_metadata(
            self.metadata, GENERATION, session_id, replicas, members, decided
        )
        for i in range(appends):
            txid = decided + 1 + i
            holders = [r for r in members if prefix.get(r, 0) > i]
            for r in holders:
                self.storages[r].log.append((session_id, txid))
            if len(holders) < quorum:
                break  # later appends cannot commit before this one
            self.committed.append((session_id, txid))
        self.trace.append(f"  members {members}, committed through {len(self.committed) - 1}")
        return True


_change = st.tuples(st.just("assign"), st.sets(st.sampled_from(NODES), min_size=1, max_size=4))
_session = st.tuples(
    st.just("session"),
    st.sets(st.sampled_from(NODES)),
    st.none() | st.integers(0, 5),
    st.integers(0, 3),
    st.dictionaries(st.sampled_from(NODES), st.integers(0, 3)),
)
_decommission = st.tuples(st.just("decommission"), st.sampled_from(NODES))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(_change, _session, _decommission), max_size=16))
def test_replica_changes_never_lose_a_commit_nor_wedge_the_partition(history):
    partition = Partition()
    try:
        for step in history:
            match step:
                case ("assign", new):
                    partition.change(new)
                case ("session", up, crash_after, appends, prefix):
                    partition.session(up, crash_after, appends, prefix)
                case ("decommission", node):
                    partition.decommission(node)
        # Every storage node still there comes back: recovery decides and opens a session.
        alive = set(NODES) - partition.gone
        assert partition.session(alive, None, 0, {}), "the partition is wedged"
        for r in partition.assignment:
            assert partition.storages[r].log == partition.committed, f"{r} differs"
    except AssertionError as e:
        raise AssertionError("\n".join([str(e), *partition.trace])) from None


def test_the_issue_example_is_refused_then_allowed_once_the_new_replica_joined():
    partition = Partition()
    partition.session({"a", "b", "c"}, None, 2, {"a": 2, "b": 2, "c": 2})
    partition.change({"a", "b", "c", "d"})
    partition.session({"a", "b", "c"}, None, 1, {"a": 1, "b": 1})  # d not up yet
    partition.change({"b", "c", "d"})
    assert partition.assignment == {"a", "b", "c", "d"}, "removing a must be refused"
    assert partition.session({"a", "b", "c", "d"}, None, 0, {})  # d joins
    partition.change({"b", "c", "d"})
    assert partition.assignment == {"b", "c", "d"}
    partition.decommission("a")
    assert "a" not in partition.gone, "a is still a member of the writing session"
    assert partition.session({"b", "c", "d"}, None, 0, {})
    partition.decommission("a")
    assert "a" in partition.gone
    assert partition.session({"b", "c", "d"}, None, 1, {"b": 1, "c": 1, "d": 1})
    for r in ("b", "c", "d"):
        assert partition.storages[r].log == partition.committed
