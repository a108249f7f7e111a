"""A flood of requests at a session the metadata does not record, on a real storage
node that follows a real ZooKeeper (issue 39, row 8).

Each request at a newer session makes the node check the partition's metadata in
ZooKeeper. 20,000 requests at session 2^63-1 made 20,000 reads while the partition's
own requests waited (an append and a read took 3.9 s instead of 0.02 s). Now a refusal
is remembered for a moment (session_checks.py): the flood costs a read a second, the
owner's requests are served meanwhile, and a session the owner records next is still
adopted at once.
"""

from __future__ import annotations

import asyncio
import socket
import time
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_protocol import run
from test_storage_bounds import records

from waltz_client.cluster.admin import create_cluster
from waltz_client.cluster.metadata import NO_SESSION, PartitionMetadata
from waltz_client.cluster.paths import ClusterPaths
from waltz_client.cluster.zk import close, connect
from waltz_client.wire.storage_client import StorageClient, StorageFailure
from waltz_client.wire.storage_messages import (
    FailureResponse,
    MaxTransactionIdRequest,
    StorageError,
)
from waltz_storage.coordination import ClusterFollower
from waltz_storage.session_checks import REFUSAL_TTL

HUGE = 2**63 - 1
FLOOD = 5000
OWNER = 5  # the session the owner recorded


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def counters(node) -> dict[str, float]:
    """The node's session-check counters, from /metrics."""
    status, text = node.get("/metrics")
    assert status == 200
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "waltz_storage_session_checks_total":
                found[s.labels["result"]] = s.value
            elif s.name == "waltz_storage_session_refusals_remembered_total":
                found["remembered"] = s.value
    return found


def record_session(zk, root: str, session: int) -> None:
    """What the owning server does before it uses a session."""
    path = ClusterPaths.of(root).partition(0)
    data, _ = zk.get(path)
    zk.set(path, replace(PartitionMetadata.decode(data), session_id=session).encode())


@pytest.fixture
def followed(storage_factory, zookeeper, zk_root: str, tmp_path: Path):
    """(storage node following ZooKeeper, a ZooKeeper client, the cluster key)."""
    port = free_port()
    zk = connect(zookeeper.connect_string)
    created = create_cluster(zk, zk_root, "t", 1, 1, [f"127.0.0.1:{port}"])
    record_session(zk, zk_root, OWNER)
    ready = tmp_path / "ready-zk.json"
    node = storage_factory(
        raw_args=[
            *("--directory", str(tmp_path / "data")),
            *("--zookeeper", zookeeper.connect_string, "--zk-root", zk_root),
            *("--host", "127.0.0.1", "--port", str(port), "--http-port", "0"),
            *("--ready-file", str(ready)),
        ],
        ready_file=ready,
    )
    try:
        yield node, zk, created.params.key
    finally:
        close(zk)


def test_a_flood_of_unrecorded_sessions_costs_a_read_a_second_and_the_owner_is_served(
    followed, zk_root: str
) -> None:
    node, zk, key = followed

    async def connect_opened() -> StorageClient:
        client = await StorageClient.connect(node.host, node.port)
        await client.open(key, 1)
        return client

    async def scenario() -> tuple[float, list]:
        owner = await connect_opened()
        stranger = await connect_opened()
        try:
            first = records(0, 10, 100)
            await owner.append(OWNER, 0, first)  # adopted: the metadata records it
            started = time.monotonic()
            flood = [
                stranger.submit(MaxTransactionIdRequest(HUGE, stranger.next_seq(), 0))
                for _ in range(FLOOD)
            ]
            # The owner's append and read, while the flood is being answered.
            later = records(10, 10, 100)
            await owner.append(OWNER, 0, later)
            read = list((await owner.records(OWNER, 0, 0, 100)).records())
            answers = await asyncio.gather(*flood)
            elapsed = time.monotonic() - started
            assert read == first + later
            assert {type(a) for a in answers} == {FailureResponse}
            assert {a.error for a in answers} == {StorageError.SESSION_UNKNOWN}
            assert f"session {HUGE} is newer" in answers[-1].message
            return elapsed, answers
        finally:
            await owner.close()
            await stranger.close()

    elapsed, _ = run(scenario(), timeout=120)
    seen = counters(node)
    # One read adopted the owner's session; the flood read ZooKeeper about once per
    # REFUSAL_TTL (plus the first), not once per request.
    assert seen.get("recorded") == 1
    allowed = 2 + elapsed / REFUSAL_TTL
    assert seen.get("not_recorded", 0) <= allowed, (seen, elapsed)
    assert seen.get("remembered", 0) >= FLOOD - allowed, seen

    # The owner's next session, recorded right after the flood, is adopted at once.
    record_session(zk, zk_root, OWNER + 1)

    async def next_session() -> int:
        async with await connect_opened() as owner:
            return await owner.max_transaction_id(OWNER + 1, 0)

    assert run(next_session()) == 19
    assert counters(node).get("recorded") == 2


def test_a_stranger_racing_the_owner_to_its_next_session_does_not_keep_it_out(
    followed, zk_root: str
) -> None:
    """A stranger tries session 6 before the owner records it: refused, and remembered.
    When the owner records 6, the watch the node's read left forgets the refusal, so
    the owner is served (at worst after REFUSAL_TTL, never for long)."""
    node, zk, key = followed

    async def attempt(session: int) -> StorageFailure | None:
        async with await StorageClient.connect(node.host, node.port) as c:
            await c.open(key, 1)
            try:
                await c.max_transaction_id(session, 0)
            except StorageFailure as e:
                return e
            return None

    refused = run(attempt(OWNER + 1))
    assert refused is not None and refused.error == StorageError.SESSION_UNKNOWN
    assert run(attempt(OWNER + 1)) is not None  # remembered
    record_session(zk, zk_root, OWNER + 1)
    refusals = 0
    deadline = time.monotonic() + 20  # generous: the machine may be busy
    while run(attempt(OWNER + 1)) is not None:
        refusals += 1
        assert time.monotonic() < deadline, "the owner's recorded session stays refused"
        time.sleep(0.02)
    # The watch forgot the refusal as the metadata changed: the owner got in at once
    # (a few tries if the watch's event was slow to arrive; without it, REFUSAL_TTL
    # of tries, dozens).
    assert refusals <= 5, refusals
    seen = counters(node)
    assert seen.get("recorded") == 1 and seen.get("not_recorded") == 1, seen


def test_the_sessions_of_many_partitions_are_read_in_one_pipelined_round_trip(
    zookeeper, zk_root: str
) -> None:
    """What a node reads for a group of partitions with new sessions (a server that took
    them all): each partition's recorded session, NO_SESSION where the metadata is
    missing, and a watch on each, as a single read leaves."""
    zk = connect(zookeeper.connect_string)
    follower = ClusterFollower(zookeeper.connect_string, zk_root)
    try:
        create_cluster(zk, zk_root, "t", 4, 1, ["127.0.0.1:1"])
        paths = ClusterPaths.of(zk_root)
        for partition, session in ((0, 5), (1, 6), (2, 7)):
            data, _ = zk.get(paths.partition(partition))
            metadata = replace(PartitionMetadata.decode(data), session_id=session)
            zk.set(paths.partition(partition), metadata.encode())
        zk.delete(paths.partition(3))
        changed: list[int] = []
        run(follower.connect())
        follower.session_changed = changed.append
        assert follower.recorded_sessions([0, 1, 2, 3]) == {0: 5, 1: 6, 2: 7, 3: NO_SESSION}
        data, _ = zk.get(paths.partition(1))
        zk.set(paths.partition(1), data)  # the owner records again: the watch fires
        deadline = time.monotonic() + 30
        while 1 not in changed and time.monotonic() < deadline:
            time.sleep(0.05)
        assert changed == [1]
    finally:
        run(follower.close())
        close(zk)
