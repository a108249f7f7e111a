"""UnreachableSince: how long each storage node has failed every probe."""

from __future__ import annotations

from waltz_server.storage_replacer import probe_interval
from waltz_server.unreachable import UnreachableSince


def test_a_node_counts_from_its_first_failed_probe_until_one_succeeds():
    t = UnreachableSince()
    t.observe("a:1", True, 0.0)
    t.observe("b:1", False, 1.0)
    t.observe("b:1", False, 4.0)  # still counted from 1.0
    assert t.seconds("b:1", 5.0) == 4.0 and t.seconds("a:1", 5.0) == 0.0
    assert t.due(4.0, 5.0) == ["b:1"] and t.due(4.5, 5.0) == []
    assert t.unreachable() == {"b:1"} and t.reachable() == {"a:1"}
    t.observe("b:1", True, 6.0)
    assert t.due(0.0, 100.0) == [] and t.reachable() == {"a:1", "b:1"}
    t.observe("b:1", False, 7.0)  # a new outage counts afresh
    assert t.seconds("b:1", 8.0) == 1.0


def test_nodes_that_left_the_assignment_and_a_new_assigner_start_afresh():
    t = UnreachableSince()
    t.observe("a:1", False, 0.0)
    t.observe("b:1", False, 0.0)
    t.keep_only(["b:1"])
    assert t.unreachable() == {"b:1"} and t.tracked() == {"b:1"}
    t.clear()
    assert t.tracked() == set() and t.seconds("b:1", 10.0) == 0.0


def test_probes_come_a_quarter_of_the_wait_apart_within_bounds():
    assert probe_interval(1.0) == 0.5
    assert probe_interval(8.0) == 2.0
    assert probe_interval(600.0) == 5.0
