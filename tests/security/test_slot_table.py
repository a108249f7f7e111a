"""The pure decisions behind connection slots (``waltz_client.runtime.peer_limits.SlotTable``,
``waltz_client.runtime.http_guard.quietest``) and the partial-frame budget's room for the frame
let through to finish (``PeerGuard.pause_above``), without sockets.

Checked here: the caps always hold; a ready connection is never displaced; at the
address cap a newcomer displaces only its own address's connections; at the total cap
the address holding the most connections not yet ready gives one up first, its oldest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given
from hypothesis import strategies as st

from waltz_client.runtime.http_guard import quietest
from waltz_client.runtime.peer_limits import MiB, PeerGuard, PeerLimits, SlotTable


@dataclass(eq=False)
class Conn:
    address: str
    name: str = ""
    ready: bool = False
    closed_for: list[str] = field(default_factory=list)
    connected_at: float = 0.0
    partial: int = 0

    def close_for(self, reason: str) -> None:
        self.closed_for.append(reason)


def test_a_stranger_gives_its_slot_to_a_newcomer_and_a_ready_peer_keeps_its_own() -> None:
    table: SlotTable[Conn] = SlotTable(max_total=3, max_per_address=3)
    server = Conn("10.0.0.1", "server")
    assert table.admit(server, server.address) == ([], None)
    table.ready(server)
    strangers = [Conn("10.0.0.9", f"s{i}") for i in range(2)]
    for s in strangers:
        assert table.admit(s, s.address) == ([], None)
    # Full: a new connection takes the oldest stranger's slot, never the server's.
    late = Conn("10.0.0.2", "late")
    assert table.admit(late, late.address) == ([strangers[0]], None)
    assert server in table and strangers[0] not in table and len(table) == 3
    table.ready(late)
    table.ready(strangers[1])
    # All ready: nobody's slot is up for the taking.
    displaced, why = table.admit(Conn("10.0.0.3"), "10.0.0.3")
    assert displaced == [] and why == "3 ready connections (max_connections)"


def test_the_address_cap_displaces_only_that_addresses_own_strangers() -> None:
    table: SlotTable[Conn] = SlotTable(max_total=10, max_per_address=2)
    a1, a2 = Conn("a"), Conn("a")
    table.admit(a1, "a")
    table.admit(a2, "a")
    other = Conn("b")
    table.admit(other, "b")
    a3 = Conn("a")
    assert table.admit(a3, "a") == ([a1], None)  # its own oldest, not b's
    table.ready(a2)
    table.ready(a3)
    displaced, why = table.admit(Conn("a"), "a")
    assert displaced == [] and why == "2 ready connections from a (max_connections_per_address)"
    assert table.at("a") == 2 and table.at("b") == 1


def test_at_the_cap_the_address_with_most_strangers_pays_first() -> None:
    table: SlotTable[Conn] = SlotTable(max_total=4, max_per_address=4)
    lone = Conn("lone")
    table.admit(lone, "lone")  # a legitimate peer, mid-handshake
    flood = [Conn("flood") for _ in range(3)]
    for c in flood:
        table.admit(c, "flood")
    # The flood keeps coming: it displaces its own, the lone peer stays.
    for _ in range(5):
        newcomer = Conn("flood")
        displaced, why = table.admit(newcomer, "flood")
        assert why is None and len(displaced) == 1 and displaced[0].address == "flood"
    assert lone in table and len(table) == 4


actions = st.lists(
    st.tuples(st.sampled_from(["admit", "ready", "release"]), st.integers(0, 5)),
    max_size=120,
)


@given(actions, st.integers(1, 8), st.integers(1, 8))
def test_the_caps_hold_and_ready_connections_are_never_displaced(
    steps: list[tuple[str, int]], max_total: int, max_per_address: int
) -> None:
    table: SlotTable[Conn] = SlotTable(max_total, max_per_address)
    held: list[Conn] = []
    for action, n in steps:
        if action == "admit":
            conn = Conn(f"10.0.0.{n}")
            displaced, why = table.admit(conn, conn.address)
            assert all(not d.ready for d in displaced)
            assert (why is None) == (conn in table)
            if why is not None:
                assert displaced == []
            for d in displaced:
                held.remove(d)
            if why is None:
                held.append(conn)
        elif held:
            conn = held[n % len(held)]
            if action == "ready":
                conn.ready = True
                table.ready(conn)
            else:
                assert table.release(conn)
                assert not table.release(conn)
                held.remove(conn)
        assert len(table) == len(held) <= max_total
        for address in {c.address for c in held}:
            at = sum(c.address == address for c in held)
            assert table.at(address) == at <= max_per_address
        assert table.unready == sum(not c.ready for c in held)


@dataclass(eq=False)
class HttpConn:
    quiet_since: float
    waiting_since: float | None = None


def test_an_http_slot_goes_from_the_longest_idle_else_the_longest_waiting() -> None:
    busy_old, busy_new = HttpConn(0.0, 5.0), HttpConn(0.0, 9.0)
    idle_old, idle_new = HttpConn(3.0), HttpConn(8.0)
    assert quietest([busy_old, idle_new, idle_old, busy_new]) is idle_old  # type: ignore[list-item]
    assert quietest([busy_new, busy_old]) is busy_old  # type: ignore[list-item]
    assert quietest([]) is None


def test_the_budget_keeps_room_for_the_frame_let_through_to_finish() -> None:
    limits = PeerLimits(partial_frames_max_bytes=256 * MiB)
    assert PeerGuard(limits, "x", max_frame_bytes=64 * MiB).pause_above == 192 * MiB
    # A frame limit over half the budget: half of it, the finishing frame's room.
    assert PeerGuard(limits, "x", max_frame_bytes=200 * MiB).pause_above == 128 * MiB


def test_the_guard_closes_the_stranger_whose_slot_it_gives_away() -> None:
    guard = PeerGuard(PeerLimits(max_connections=2, max_connections_per_address=2), "Open")
    first, second, third = Conn("x"), Conn("y"), Conn("z")
    assert guard.admit(first) is None and guard.admit(second) is None  # type: ignore[arg-type]
    guard.ready(second)  # type: ignore[arg-type]
    assert guard.admit(third) is None  # type: ignore[arg-type]
    assert first.closed_for and "slot went to a new connection from z" in first.closed_for[0]
    assert not second.closed_for and set(guard.connections) == {second, third}
    guard.forget(first, 0)  # type: ignore[arg-type]  # its connection_lost comes later
    assert len(guard.connections) == 2
