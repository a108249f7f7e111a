"""Operating a server: back pressure, metrics, health and readiness, bad configuration."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from server_harness import PartitionClient, wait_for

from waltz_client.wire.framing import HANDSHAKE_BYTES, Hello, Service

pytestmark = pytest.mark.timeout(240)


def http_get(cluster, path: str, server: int = 0) -> tuple[int, str]:
    url = f"http://127.0.0.1:{cluster.servers[server].ready['http_port']}{path}"
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metric(cluster, name: str, partition: int = 0) -> float:
    _, text = http_get(cluster, "/metrics")
    prefix = f'{name}{{partition="{partition}"}} '
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    raise AssertionError(f"no {prefix!r} in /metrics")


def replica_metric(cluster, name: str, replica: str, partition: int = 0) -> float | None:
    _, text = http_get(cluster, "/metrics")
    labels = f'partition="{partition}",replica="{replica}"'
    prefix = f"waltz_server_partition_replica_{name}{{{labels}}} "
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    return None


def test_a_full_queue_stops_reading_the_socket_until_storage_catches_up(make_cluster):
    # The pause must stall commits without ending the store session. After the resume
    # one replica may lag the other while both work through their backlog; a member more
    # than 8 x max-in-flight batches behind ends the session (its in-flight batches, 126
    # appends at max-in-flight 2, were then lost: flush answered 19873). Hence room for
    # 64 batches of lag, and a long straggler limit for a slow machine.
    cluster = make_cluster(
        server_args=[
            *("--max-queue", "200", "--max-in-flight", "8", "--max-batch-bytes", "65536"),
            *("--storage-timeout", "120"),
        ]
    )
    total = 20_000

    async def scenario() -> None:
        client = PartitionClient(cluster, 0)
        await client.mount()
        cluster.storages[1].pause()
        cluster.storages[2].pause()  # no quorum acknowledges: commits stall
        try:
            for i in range(total):
                client.append(b"%06d" % i + b"x" * 1000)
            await asyncio.sleep(2)
            queued = metric(cluster, "waltz_server_partition_queue_size")
            assert queued <= 200 + 300, f"the server kept reading: {queued} queued"
            assert client.conn is not None
            unsent = client.conn._writer.transport.get_write_buffer_size()
            assert unsent > 5_000_000, f"only {unsent} bytes wait in the client"
            assert client.high_water_mark == -1
        finally:
            cluster.storages[1].resume()
            cluster.storages[2].resume()
        assert await client.flush(timeout=120) == total - 1
        await client.wait_feed(total - 1)
        await client.close()

    asyncio.run(scenario())


def test_metrics_health_and_readiness_follow_the_quorum(make_cluster):
    cluster = make_cluster()

    async def write(n: int) -> int:
        client = PartitionClient(cluster, 0)
        await client.mount()
        for i in range(n):
            client.append(b"m-%d" % i)
        hwm = await client.flush()
        await client.close()
        return hwm

    hwm = asyncio.run(write(25))
    status, body = http_get(cluster, "/healthz")
    assert status == 200, body
    doc = json.loads(body)
    assert doc["zookeeper_connected"] and doc["partitions"]["0"]["state"] == "active"
    assert http_get(cluster, "/readyz")[0] == 200
    assert metric(cluster, "waltz_server_partition_high_water_mark") == hwm
    assert metric(cluster, "waltz_server_partition_live_replicas") == 3
    assert metric(cluster, "waltz_server_partition_quorum") == 1
    assert metric(cluster, "waltz_server_partition_committed_total") >= 25
    assert metric(cluster, "waltz_server_partition_generation") >= 1

    addresses = cluster.layout.storage_addresses
    for address in addresses:  # every replica in the session, holding every commit
        assert replica_metric(cluster, "in_session", address) == 1
        assert replica_metric(cluster, "lag", address) == 0

    cluster.storages[2].kill()
    asyncio.run(write(5))  # a write notices the lost replica and starts a new session
    wait_for(lambda: metric(cluster, "waltz_server_partition_live_replicas") == 2, 30, "2 live")
    assert metric(cluster, "waltz_server_partition_quorum") == 1
    assert replica_metric(cluster, "in_session", addresses[2]) == 0
    assert replica_metric(cluster, "in_session", addresses[0]) == 1
    cluster.storages[1].kill()
    asyncio.run(_append_without_waiting(cluster))
    wait_for(lambda: http_get(cluster, "/healthz")[0] == 503, 30, "unhealthy")
    assert metric(cluster, "waltz_server_partition_active") == 0
    assert metric(cluster, "waltz_server_partition_quorum") == 0
    cluster.storages[1].start()
    wait_for(lambda: http_get(cluster, "/healthz")[0] == 200, 30, "healthy again")
    _, text = http_get(cluster, "/metrics")
    assert 'waltz_server_commit_seconds_bucket{le="0.01",partition="0"}' in text


async def _append_without_waiting(cluster) -> None:
    client = PartitionClient(cluster, 0)
    await client.mount()
    client.append(b"no quorum")
    await asyncio.sleep(1)
    await client.close()


def test_bad_configuration_is_one_clear_line():
    result = subprocess.run(
        [sys.executable, "-m", "waltz_server.main", "--zookeeper", "x", "--lock-hashes", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("waltz-server: error: setting lock_hashes")


def test_the_checkpoint_interval_starts_new_store_sessions(make_cluster):
    cluster = make_cluster(server_args=["--checkpoint-interval", "50"])

    async def write(n: int) -> None:
        client = PartitionClient(cluster, 0)
        await client.mount()
        for i in range(n):
            client.append(b"c-%d" % i)
        await client.flush()
        await client.close()

    asyncio.run(write(60))
    wait_for(lambda: metric(cluster, "waltz_server_partition_sessions_total") >= 2, 30, "rollover")
    asyncio.run(write(60))
    wait_for(lambda: metric(cluster, "waltz_server_partition_sessions_total") >= 3, 30, "rollover")


def test_a_new_session_on_the_same_server_keeps_the_lock_table(make_cluster):
    """The checkpoint interval ends a session; the next one runs on the same server,
    which ran the session that wrote last: it keeps its lock table, so a client behind
    the new session's mark conflicts only on the locks taken after its own mark (a
    reset would fail every locked append of such a client)."""
    cluster = make_cluster(server_args=["--checkpoint-interval", "20"])

    async def scenario() -> None:
        client = PartitionClient(cluster, 0)
        await client.mount()
        client.append(b"a", write_locks=(1,))  # transaction 0
        for i in range(30):  # 1..30 (append locks: taken, not checked)
            client.append(b"b-%d" % i, append_locks=(2,))
        await client.flush()
        assert client.high_water_mark == 30 and not client.lock_failures
        await asyncio.to_thread(
            wait_for,
            lambda: metric(cluster, "waltz_server_partition_sessions_total") >= 2,
            30,
            "a new session",
        )
        # Computed against transaction 0 only.
        untouched = client.append(b"c", write_locks=(1,), client_high_water_mark=0)
        retaken = client.append(b"d", write_locks=(2,), client_high_water_mark=0)
        await client.flush()
        assert untouched in client.committed()
        assert client.lock_failures == {retaken: 30}
        await client.close()

    asyncio.run(scenario())


def test_a_paused_replica_is_left_behind_and_rejoins_when_it_wakes(make_cluster):
    cluster = make_cluster(server_args=["--storage-timeout", "2"])

    async def write(client: PartitionClient, n: int, tag: bytes) -> None:
        for i in range(n):
            client.append(tag + b"-%d" % i)
        await client.flush(timeout=60)

    async def scenario() -> None:
        client = PartitionClient(cluster, 0)
        await client.mount()
        await write(client, 100, b"before")
        cluster.storages[2].pause()
        try:
            # A quorum (storage-0 and -1) keeps committing while storage-2 is frozen...
            await write(client, 100, b"frozen")
            assert client.high_water_mark == 199
            # ...and the session drops it instead of buffering for it forever.
            await asyncio.to_thread(
                wait_for,
                lambda: metric(cluster, "waltz_server_partition_live_replicas") == 2,
                30,
                "a session without the paused replica",
            )
            await write(client, 100, b"without")
        finally:
            cluster.storages[2].resume()
        await asyncio.to_thread(
            wait_for,
            lambda: metric(cluster, "waltz_server_partition_live_replicas") == 3,
            30,
            "the replica to rejoin",
        )
        await write(client, 10, b"rejoined")
        await client.close()

    asyncio.run(scenario())


def test_many_tiny_transactions_are_split_into_batches_storage_accepts(make_cluster):
    cluster = make_cluster()
    n = 60_000  # more than one storage Append may carry when every record is empty

    async def scenario() -> None:
        client = PartitionClient(cluster, 0)
        await client.mount()
        for _ in range(n):
            client.append(b"")
        assert await client.flush(timeout=120) == n - 1
        await client.close()

    asyncio.run(scenario())
    assert metric(cluster, "waltz_server_partition_sessions_total") == 1


def test_malformed_frames_are_counted(make_cluster):
    cluster = make_cluster()
    port = cluster.servers[0].ready["port"]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as bad:
        bad.sendall(Hello(Service.SERVER, 1, 1).encode())
        bad.recv(HANDSHAKE_BYTES)
        bad.sendall(b"\x00\x00\x00\x02\x63\x00")  # an unknown message type
        assert bad.recv(100) == b""
    _, text = http_get(cluster, "/metrics")
    assert 'waltz_server_client_errors_total{kind="malformed"} 1.0' in text


def test_a_clean_shutdown_is_not_reported_as_a_lost_zookeeper_session(make_cluster):
    cluster = make_cluster()
    asyncio.run(_append_without_waiting(cluster))
    cluster.stop()  # SIGTERM
    with open(cluster.servers[0].log_path) as f:
        log = f.read()
    assert "ZooKeeper session closed" in log
    assert "ZooKeeper session lost" not in log
    assert " ERROR " not in log, log
