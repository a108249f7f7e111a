"""Fixtures for the link-cut fault tests: ``links`` (a LinkCut, cleaned up whatever
happens) and a few helpers shared by the tests.

The cluster fixtures (``zookeeper``, ``make_cluster``) come from tests/conftest.py; the
helpers the tests import are in fault_harness.py (a conftest.py is a module named
``conftest``, shared by every folder, so tests do not import from one).
Each test is skipped with a one-line reason when we are not root, nft is missing or the
kernel refuses the rules; both checks run once per session.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from netcut import LinkCut, cgroup_cut_unavailable, nft_unavailable, remove_leftovers

log = logging.getLogger(__name__)


_reasons: dict[str, str | None] = {}


def _reason(check: str) -> str | None:
    if check not in _reasons:
        _reasons[check] = nft_unavailable()
        if check == "cgroup" and _reasons[check] is None:
            _reasons[check] = cgroup_cut_unavailable()
    return _reasons[check]


@pytest.fixture(scope="session", autouse=True)
def _no_leftover_cuts() -> Iterator[None]:
    """Tables and cgroups of earlier runs that were killed go first; ours go at the end
    (each LinkCut also removes its own on exit)."""
    usable = nft_unavailable() is None
    if usable:
        remove_leftovers()
    yield
    if usable:
        remove_leftovers(ours=True)


@pytest.fixture
def links() -> Iterator[LinkCut]:
    """A LinkCut for cutting by port; skips the test where nftables cannot be used."""
    reason = _reason("nft")
    if reason:
        pytest.skip(reason)
    with LinkCut() as cut:
        yield cut


@pytest.fixture
def cgroup_links() -> Iterator[LinkCut]:
    """A LinkCut that can also cut one process off a shared port (by cgroup)."""
    reason = _reason("cgroup")
    if reason:
        pytest.skip(reason)
    with LinkCut() as cut:
        yield cut
