"""The protocol fuzzer (``waltz fuzz``): its pure core, then both daemons under fire.

The pure tests check what makes the fuzzer worth running: the same seed gives the same
bytes, the frames it starts from are valid (they decode with the project's own
decoders, every request type of both protocols among them), and each mutation breaks
what it claims to. The integration test sends a few thousand mutated frames to a storage
node and a server of a real cluster, then checks both are alive and a client is served.

The integration test fuzzes storage as a stranger (``replay_sessions=False``): today a
peer replaying a partition's current session can make a replica vouch for garbage
(Append, then Set Low-water Mark), which diverges that replica or wedges the
partition's recovery; ``waltz fuzz`` without ``--no-replay-sessions`` finds it.
"""

from __future__ import annotations

import asyncio
import collections
import random
import uuid

import pytest

from waltz_client.fuzz import (
    MUTATIONS,
    PROTOCOLS,
    FuzzTarget,
    base_frame,
    describe_stats,
    fuzz_cluster,
    hello_for,
    plan_connection,
    plan_connections,
)
from waltz_client.wire.client_messages import CLIENT_REQUESTS, decode_client_request
from waltz_client.wire.framing import FrameDecoder, Hello
from waltz_client.wire.storage_messages import STORAGE_REQUESTS, OpenRequest, decode_request

KEY = uuid.UUID("0f0e0d0c-0b0a-4908-8706-050403020100")
TARGETS = [FuzzTarget("server", 3), FuzzTarget("storage", 3, KEY)]


def decode(t: FuzzTarget, frame: bytes):
    """The one message in ``frame``, as the daemon of ``t`` decodes it."""
    frames = FrameDecoder().feed(frame)
    assert len(frames) == 1
    if t.protocol == "server":
        return decode_client_request(*frames[0])
    return decode_request(*frames[0])


@pytest.mark.parametrize("t", TARGETS, ids=PROTOCOLS)
def test_plans_are_a_function_of_the_seed(t: FuzzTarget) -> None:
    first = list(plan_connections(t, 7, 3000))
    assert first == list(plan_connections(t, 7, 3000))
    assert sum(len(p.frames) for p in first) == 3000
    other = list(plan_connections(t, 8, 3000))
    assert [p.stream for p in other] != [p.stream for p in first]
    # Each connection replays alone from its own seed (the last one may have been cut).
    for plan in first[:-1]:
        assert plan_connection(t, plan.seed, plan.index) == plan
    # Knowing the cluster key changes the key's bytes in Open frames, never the draws.
    blind = list(plan_connections(FuzzTarget(t.protocol, t.num_partitions), 7, 3000))
    assert [(p.opening, p.mutations) for p in blind] == [(p.opening, p.mutations) for p in first]
    assert [[len(f) for f in p.frames] for p in blind] == [
        [len(f) for f in p.frames] for p in first
    ]


@pytest.mark.parametrize("t", TARGETS, ids=PROTOCOLS)
def test_base_frames_are_valid_and_cover_every_request(t: FuzzTarget) -> None:
    requests = CLIENT_REQUESTS if t.protocol == "server" else STORAGE_REQUESTS
    rng = random.Random(11)
    seen: collections.Counter[str] = collections.Counter()
    for _ in range(2000):
        frame = base_frame(rng, t)
        message = decode(t, frame.data)
        assert type(message).__name__ == frame.name
        assert message.encode() == frame.data
        seen[frame.name] += 1
        # The field map matches the encoding: in order, inside the frame, and the
        # length prefix where a frame's length is.
        assert frame.fields[0].offset == 0
        assert int.from_bytes(frame.data[:4], "big") == len(frame.data) - 4
        end = 0
        for f in frame.fields:
            assert f.offset >= end and f.offset + f.width <= len(frame.data), (frame.name, f)
            end = f.offset + f.width
    assert set(seen) == {cls.__name__ for cls in requests.values()}


@pytest.mark.parametrize("t", TARGETS, ids=PROTOCOLS)
def test_unmutated_frames_of_a_plan_decode(t: FuzzTarget) -> None:
    valid = 0
    for plan in plan_connections(t, 3, 5000):
        if plan.opening in ("handshake", "open", "no-open"):
            assert plan.hello == hello_for(t)
            assert Hello.decode(plan.hello).service.name.lower() == t.protocol
        if plan.opening == "open":
            opened = decode(t, plan.open_frame)
            assert isinstance(opened, OpenRequest)
            assert (opened.cluster_key, opened.num_partitions) == (KEY, t.num_partitions)
        for frame, mutation in zip(plan.frames, plan.mutations, strict=True):
            if not mutation:
                decode(t, frame)
                valid += 1
    assert valid > 1000


@pytest.mark.parametrize("t", TARGETS, ids=PROTOCOLS)
def test_mutations_are_deterministic_and_break_what_they_say(t: FuzzTarget) -> None:
    for name, (mutation, _) in MUTATIONS.items():
        changed = 0
        for i in range(200):
            frame = base_frame(random.Random(i), t)
            out = mutation(random.Random(1000 + i), frame, t)
            assert out == mutation(random.Random(1000 + i), frame, t), name
            if name == "duplicate":
                assert len(out) >= 2 and set(out) == {frame.data}
                continue
            (mutated,) = out
            changed += mutated != frame.data
            if name == "frame_length":
                assert mutated[4:] == frame.data[4:]
            if name == "inner_length":  # one count or length, or else the frame's
                diff = [k for k in range(len(mutated)) if mutated[k] != frame.data[k]]
                lengths = [f for f in frame.fields if f.kind == "length"]
                assert all(any(f.offset <= k < f.offset + f.width for f in lengths) for k in diff)
        if name != "duplicate":
            assert changed >= 180, (name, changed)  # a boundary value may be the value
    # Every mutation is drawn in a plan of a few thousand frames.
    drawn = collections.Counter(
        m for plan in plan_connections(t, 5, 5000) for m in plan.mutations if m
    )
    assert set(drawn) == set(MUTATIONS)


def test_a_stranger_never_sends_a_live_session() -> None:
    t = FuzzTarget("storage", 3, KEY, replay_sessions=False)
    frames = [f for plan in plan_connections(t, 9, 5000) for f in plan.frames]
    sessions = [int.from_bytes(f[5:13], "big", signed=True) for f in frames if len(f) >= 13]
    assert not [s for s in sessions if 0 <= s < 1 << 16]
    # The same draws otherwise: only session fields move.
    replaying = [
        f for p in plan_connections(FuzzTarget("storage", 3, KEY), 9, 5000) for f in p.frames
    ]
    assert [len(f) for f in frames] == [len(f) for f in replaying]
    assert sum(a != b for a, b in zip(frames, replaying, strict=True)) > 100


@pytest.mark.timeout(180)
def test_fuzzed_daemons_stay_up_and_serve_a_client(make_cluster) -> None:
    cluster = make_cluster(partitions=2, servers=1)
    frames = 2500
    result = asyncio.run(
        fuzz_cluster(cluster, frames=frames, seed=20240601, concurrency=8, replay_sessions=False)
    )
    report = "\n".join(line for s in result.stats for line in describe_stats(s))
    assert [s.name for s in result.stats] == ["storage-0", "server-0"]
    for s in result.stats:
        assert s.alive_after and s.answered_after and not s.stopped, report
        assert s.frames + s.unsent == frames, report
        assert s.frames > frames // 2 and s.mutated > 0 and s.connections > 50, report
    assert not result.dead, result.dead
    assert all(p.running for p in (*cluster.storages, *cluster.servers))
    assert result.check.ok, result.check
    assert result.check.read_back == result.check.committed > 0
    # An exception the fuzzer provoked, even one a daemon survived, is a finding.
    tracebacks = {
        name: lines
        for name, lines in result.logged_errors.items()
        if any("Traceback" in line for line in lines)
    }
    assert not tracebacks, tracebacks
