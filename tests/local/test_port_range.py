"""Local cluster ports: parallel pickers (test workers) get disjoint slices."""

from __future__ import annotations

import itertools

import pytest

from waltz_client.tools.local.cluster import LocalClusterError, _free_port, _port_range


def test_slices_are_disjoint_and_cover_the_range(monkeypatch):
    monkeypatch.delenv("WALTZ_PORT_SLICE", raising=False)
    first, last = _port_range()
    slices = []
    for i in range(3):
        monkeypatch.setenv("WALTZ_PORT_SLICE", f"{i}/3")
        slices.append(_port_range())
    assert slices[0][0] == first and slices[-1][1] <= last
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(slices))
    monkeypatch.setenv("WALTZ_PORT_SLICE", "1/3")
    low, high = slices[1]
    assert all(low <= _free_port(set()) < high for _ in range(20))


@pytest.mark.parametrize("bad", ["2", "a/b", "3/3", "-1/2"])
def test_a_bad_slice_is_refused_naming_the_variable(monkeypatch, bad):
    monkeypatch.setenv("WALTZ_PORT_SLICE", bad)
    with pytest.raises(LocalClusterError, match="WALTZ_PORT_SLICE"):
        _port_range()
