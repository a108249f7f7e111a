"""What may shrink a partition on a storage node (truncate_rules.py): the local low-water
mark, a truncate, the log start. Pure rules, checked over every small state with
hypothesis; the daemon's answers to such requests are in test_service.py."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from waltz_storage.truncate_rules import (
    local_low_water_mark,
    log_start_refusal,
    low_water_mark_refusal,
    truncate_refusal,
    unchecked_log_start,
)

P = 3
txids = st.integers(-1, 40)
sessions = st.integers(-1, 8)


# --- the local low-water mark ------------------------------------------------------------


@given(mark=txids, max_txid=txids)
def test_the_local_mark_is_the_mark_as_far_as_the_log_reaches(mark: int, max_txid: int) -> None:
    local = local_low_water_mark(mark, max_txid)
    assert local <= mark and local <= max_txid
    assert local in (mark, max_txid)


@given(marks=st.lists(st.tuples(sessions, txids, txids), max_size=12), start=txids)
def test_the_local_mark_never_goes_down(marks: list[tuple[int, int, int]], start: int) -> None:
    """Whatever SetLowWaterMark requests come, a local mark the rule lets through is
    never below the one before (the committed prefix never shrinks)."""
    current = start
    for session, mark, max_txid in marks:
        local = local_low_water_mark(mark, max_txid)
        refused = low_water_mark_refusal(P, session, local, current)
        assert (refused is None) == (local >= current)
        if refused is None:
            current = local
        else:
            assert f"partition {P}: session {session}" in refused
            assert f"from {current} to {local}" in refused


# --- truncate ------------------------------------------------------------------------------


@given(session=sessions, txid=txids, max_txid=txids, floor=txids, barrier=sessions)
def test_a_truncate_never_drops_a_committed_transaction(
    session: int, txid: int, max_txid: int, floor: int, barrier: int
) -> None:
    refused = truncate_refusal(
        P, session, txid, max_txid=max_txid, local_low_water_mark=floor, no_truncate_through=barrier
    )
    if txid < floor:
        assert refused is not None and f"local low-water mark {floor}" in refused


@given(session=sessions, txid=txids, max_txid=txids, floor=txids, barrier=sessions)
def test_a_session_that_appended_here_drops_nothing(
    session: int, txid: int, max_txid: int, floor: int, barrier: int
) -> None:
    refused = truncate_refusal(
        P, session, txid, max_txid=max_txid, local_low_water_mark=floor, no_truncate_through=barrier
    )
    if session <= barrier and txid < max_txid:
        assert refused is not None
    if refused is not None and txid >= floor:
        assert "truncates only before it appends" in refused


@given(session=sessions, txid=txids, max_txid=txids, floor=txids, barrier=sessions)
def test_a_truncate_is_refused_for_those_two_reasons_only(
    session: int, txid: int, max_txid: int, floor: int, barrier: int
) -> None:
    refused = truncate_refusal(
        P, session, txid, max_txid=max_txid, local_low_water_mark=floor, no_truncate_through=barrier
    )
    drops_appended = txid < max_txid and session <= barrier
    assert (refused is None) == (txid >= floor and not drops_appended)


def test_a_truncate_that_keeps_the_whole_log_is_allowed_to_any_session() -> None:
    for txid in (9, 10):  # at the end of the log, or past it: nothing is dropped
        assert (
            truncate_refusal(P, 1, txid, max_txid=9, local_low_water_mark=4, no_truncate_through=7)
            is None
        )


def test_the_refusals_say_why() -> None:
    committed = truncate_refusal(P, 8, 3, max_txid=9, local_low_water_mark=5, no_truncate_through=7)
    assert committed == (
        "partition 3: truncating to 3 would drop transactions up to the local low-water "
        "mark 5, which are committed"
    )
    appended = truncate_refusal(P, 7, 6, max_txid=9, local_low_water_mark=5, no_truncate_through=7)
    assert appended == (
        "partition 3: session 7 may not truncate here: it appended to this replica, or was "
        "current when the node started (a store session truncates only before it appends)"
    )


# --- the log start -------------------------------------------------------------------------


@given(
    session=sessions,
    start=txids,
    max_txid=txids,
    recorded=st.none() | txids,
    barrier=sessions,
)
def test_the_log_start_moves_only_as_far_as_recorded_and_skips_only_for_a_newcomer(
    session: int, start: int, max_txid: int, recorded: int | None, barrier: int
) -> None:
    refused = log_start_refusal(
        P, session, start, max_txid=max_txid, recorded=recorded, no_truncate_through=barrier
    )
    beyond_recorded = recorded is not None and start > recorded
    skips_appended = start > max_txid + 1 and session <= barrier
    assert (refused is None) == (not beyond_recorded and not skips_appended)
    if beyond_recorded:  # the metadata's word is checked first
        assert refused is not None and f"records ({recorded})" in refused
    elif skips_appended:
        assert refused is not None and f"skip this replica ahead to {start}" in refused


def test_a_log_start_the_metadata_cannot_confirm_is_refused_with_the_error() -> None:
    message = unchecked_log_start(P, 12, ConnectionError("connection lost"))
    assert message == (
        "partition 3: cannot check log start 12 against the cluster metadata "
        "(ConnectionError: connection lost); retry"
    )
