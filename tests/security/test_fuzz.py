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

from waltz_client.tools.fuzz.cluster import fuzz_cluster
from waltz_client.tools.fuzz.connections import TlsDial
from waltz_client.tools.fuzz.frames import PROTOCOLS, FuzzTarget, base_frame
from waltz_client.tools.fuzz.mutations import MUTATIONS
from waltz_client.tools.fuzz.plans import hello_for, plan_connection, plan_connections
from waltz_client.tools.fuzz.report import describe_stats
from waltz_client.tools.fuzz.tls import (
    MAX_RECORD_BYTES,
    TLS_MUTATIONS,
    hello_fields,
    mutate_client_hello,
)
from waltz_client.tools.local.certs import local_pki
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


# --- the TLS ports ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def client_hello(tmp_path_factory) -> bytes:
    """A real ClientHello of a client context with a certificate (a throw-away CA)."""
    pki = local_pki(str(tmp_path_factory.mktemp("pki")), {"waltz-client": ["127.0.0.1"]})
    return TlsDial.of(pki["waltz-client"], "127.0.0.1").client_hello()


def test_the_client_hello_fields_are_where_the_rfc_puts_them(client_hello: bytes) -> None:
    fields = {f.name: f for f in hello_fields(client_hello)}
    value = {
        n: int.from_bytes(client_hello[f.offset : f.offset + f.width]) for n, f in fields.items()
    }
    assert value["content type"] == 0x16 and value["handshake type"] == 1
    assert value["record length"] == len(client_hello) - 5
    assert value["handshake length"] == len(client_hello) - 9
    ext = fields["extensions length"]
    assert ext.offset + 2 + value["extensions length"] == len(client_hello)


def test_tls_plans_mix_strangers_anonymous_and_certified_peers(client_hello: bytes) -> None:
    t = FuzzTarget("server", 3, tls_hello=client_hello)
    plans = list(plan_connections(t, 5, 4000))
    assert plans == list(plan_connections(t, 5, 4000))  # a function of the seed and hello
    openings = collections.Counter(p.opening for p in plans)
    assert openings["tls-stranger"] > len(plans) // 8, openings
    assert openings["tls-no-cert"] > 0 and openings["handshake"] > len(plans) // 3, openings
    strangers = [p for p in plans if p.opening == "tls-stranger"]
    assert all(p.raw and not p.frames and p.stream == p.raw for p in strangers)
    assert {p.tls_mutation for p in strangers} == set(TLS_MUTATIONS)
    assert sum(p.raw != client_hello for p in strangers) > 0.9 * len(strangers)
    # A plain port's plans do not change: the TLS draws are taken only on a TLS port.
    plain = FuzzTarget("server", 3)
    assert all(p.opening != "tls-stranger" for p in plan_connections(plain, 5, 4000))


def test_tls_mutations_break_what_they_say(client_hello: bytes) -> None:
    plain = hello_for(FuzzTarget("server", 3))
    body = client_hello[5:]
    for seed in range(300):
        rng = random.Random(seed)
        name, out = mutate_client_hello(rng, client_hello, plain)
        if name == "split":  # records whose bodies are the handshake again
            records, pos = [], 0
            while pos < len(out):
                n = int.from_bytes(out[pos + 3 : pos + 5])
                records.append(out[pos + 5 : pos + 5 + n])
                pos += 5 + n
            assert pos == len(out) and b"".join(records) == body and len(records) > 1
        elif name == "oversized":
            assert int.from_bytes(out[3:5]) > MAX_RECORD_BYTES
        elif name == "plain":
            assert out.startswith(plain)
        elif name == "truncate":
            assert client_hello.startswith(out) and len(out) < len(client_hello)
        elif name == "sslv2":
            assert out[0] & 0x80 and out[2] == 1
        elif name != "garbage":
            assert out != client_hello, name


@pytest.mark.timeout(240)
def test_fuzzed_tls_daemons_stay_up_and_serve_a_client(make_cluster) -> None:
    """Mutated handshakes, handshakes without a certificate and frames inside TLS, to a
    storage node and a server on mutual TLS; then a client on TLS is served."""
    cluster = make_cluster(partitions=2, servers=1, tls=True)
    result = asyncio.run(
        fuzz_cluster(cluster, frames=4000, seed=20261128, concurrency=8, replay_sessions=False)
    )
    report = "\n".join(line for s in result.stats for line in describe_stats(s))
    for s in result.stats:
        assert s.alive_after and s.answered_after and not s.stopped, report
        assert s.tls_strangers > 10 and s.tls_no_cert > 0, report
        assert s.frames > 2000 and s.mutated > 0, report
    assert not result.dead and result.check.ok, (result.dead, result.check)
    assert result.check.read_back == result.check.committed > 0
    tracebacks = {
        name: lines
        for name, lines in result.logged_errors.items()
        if any("Traceback" in line for line in lines)
    }
    assert not tracebacks, tracebacks


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tls-ca", "/nonexistent.pem"], "--tls-ca: /nonexistent.pem does not exist"),
        (["--tls-cert", "/etc/hostname"], "--tls-key: needed with --tls-cert"),
    ],
)
def test_bad_tls_flags_are_refused_naming_the_flag(args, message) -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [
            *(sys.executable, "-m", "waltz_client.tools.cli", "fuzz"),
            *("--target", "127.0.0.1:1", "--protocol", "server", *args),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and proc.stdout.strip() == f"waltz fuzz: error: {message}"
