"""Replacing a storage node: the servers do it by themselves for a node that stays
unreachable (``--replace-storage-after``), and `waltz cluster replace-storage` does it by
hand, for a dead node or a live one being retired. Real processes: a SIGKILLed storage
node, real ZooKeeper, the replicas' files read back."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request

import pytest
from server_harness import Put, read_all, replica_logs, wait_for, write_each

from waltz_client import WaltzClient, WaltzClientConfig
from waltz_client.cluster import admin
from waltz_client.cluster.replace_storage import read_replacements
from waltz_client.cluster.zk import close

pytestmark = pytest.mark.timeout(300)


def assigned_logs_identical(cluster, partitions: range, expected: dict[int, list[bytes]]) -> bool:
    """Every replica assigned now holds exactly the expected transactions of each partition."""
    zk = cluster.zk_connect()
    try:
        assignment, _ = admin.read_assignment(zk, cluster.layout.root)
    finally:
        close(zk)
    addresses = cluster.layout.storage_addresses
    for p in partitions:
        logs = replica_logs(cluster, p)
        for address in assignment.replicas_of(p):
            held = [r.data for r in logs[addresses.index(address)]]
            if held != expected[p]:
                return False
    return True


def show_json(cluster) -> dict:
    out = subprocess.run(
        [
            sys.executable, "-m", "waltz_client.tools.cli", "cluster", "show", "--json",
            "--zookeeper", cluster.zookeeper_connect, "--root", cluster.layout.root,
        ],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return json.loads(out.stdout)


def server_metrics(cluster) -> str:
    zk = cluster.zk_connect()
    try:
        servers = admin.read_cluster(zk, cluster.layout.root).servers
    finally:
        close(zk)
    registration = next(iter(servers.values()))
    url = f"http://127.0.0.1:{registration.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=30) as answer:
        return answer.read().decode()


def test_the_servers_replace_a_storage_node_that_stays_unreachable(make_cluster):
    cluster = make_cluster(partitions=4, storages=4, server_args=["--replace-storage-after", "2"])
    lost = cluster.layout.storage_addresses[3]
    asyncio.run(write_each(cluster, range(4), 20, b"before"))
    cluster.storages[3].kill()  # SIGKILL: its volume is as good as gone
    asyncio.run(write_each(cluster, range(4), 20, b"during"))

    def gone() -> bool:
        zk = cluster.zk_connect()
        try:
            assignment, _ = admin.read_assignment(zk, cluster.layout.root)
        finally:
            close(zk)
        return lost not in assignment.storages

    wait_for(gone, 180, f"{lost} to leave the assignment")
    asyncio.run(write_each(cluster, range(4), 20, b"after"))

    doc = show_json(cluster)
    assert lost not in doc["storages"]
    for p in doc["partitions"]:
        replicas = [s for s, entry in doc["storages"].items() if int(p) in entry["partitions"]]
        assert len(replicas) == 3, (p, replicas)
        assert lost not in replicas
    assert doc["replacements"]["replacing"] == {}
    actions = [e["action"] for e in doc["replacements"]["events"] if e["storage"] == lost]
    assert actions[0] == "started" and actions[-1] == "removed", actions
    assert "assigned" in actions and "unassigned" in actions
    started = next(e for e in doc["replacements"]["events"] if e["action"] == "started")
    assert "unreachable from server" in started["detail"]

    # Nothing committed is lost, and every replica assigned now holds all of it.
    expected = {
        p: [
            b"%s-%d-%d" % (tag, p, i) for tag in (b"before", b"during", b"after") for i in range(20)
        ]
        for p in range(4)
    }
    for p in range(4):
        assert sorted(read_all(cluster, p)) == sorted(expected[p])
    ordered = {p: read_all(cluster, p) for p in range(4)}
    wait_for(
        lambda: assigned_logs_identical(cluster, range(4), ordered),
        120,
        "every assigned replica to hold the whole log",
    )

    metrics = server_metrics(cluster)
    assert 'waltz_server_storage_replacement_steps_total{action="removed"} 1.0' in metrics
    assert "waltz_server_storage_replacing{" not in metrics  # none under way any more


def test_with_no_node_to_spare_nothing_moves_and_a_returning_node_cancels_it(make_cluster):
    """Three nodes, three replicas: a dead node's partitions have nowhere else to go. The
    replacement is recorded and says why it waits; the node comes back and the
    replacement is cancelled, the assignment untouched."""
    cluster = make_cluster(partitions=2, storages=3, server_args=["--replace-storage-after", "1"])
    lost = cluster.layout.storage_addresses[2]
    zk = cluster.zk_connect()
    try:
        before, _ = admin.read_assignment(zk, cluster.layout.root)
        cluster.storages[2].kill()
        wait_for(
            lambda: lost in read_replacements(zk, cluster.layout.root)[0].replacing,
            120,
            "the replacement to be recorded",
        )
        asyncio.run(write_each(cluster, range(2), 10, b"meanwhile"))  # 2 of 3 commit
        assert admin.read_assignment(zk, cluster.layout.root)[0] == before
        cluster.storages[2].start()

        def cancelled() -> bool:
            record, _ = read_replacements(zk, cluster.layout.root)
            return lost not in record.replacing and any(
                e.action == "cancelled" and e.storage == lost for e in record.events
            )

        wait_for(cancelled, 120, "the replacement to be cancelled")
        assert admin.read_assignment(zk, cluster.layout.root)[0] == before
    finally:
        close(zk)


def test_replace_storage_by_hand_retires_a_live_node_under_load(make_cluster):
    """No automatic replacement: `waltz cluster replace-storage --wait` moves a live node's
    replicas while a producer writes; it leaves once its new replicas joined."""
    cluster = make_cluster(partitions=2, storages=4)
    retiring = cluster.layout.storage_addresses[0]

    async def scenario() -> None:
        stop = asyncio.Event()
        written: dict[int, int] = {0: 0, 1: 0}

        async def produce() -> None:
            config = WaltzClientConfig(
                cluster.zookeeper_connect, zk_root=cluster.layout.root, feed=False
            )
            async with WaltzClient(config) as producer:
                while not stop.is_set():
                    batch = [
                        Put(b"load-%d-%d" % (p, written[p] + k), p)
                        for p in (0, 1)
                        for k in range(10)
                    ]
                    results = await asyncio.gather(*(producer.submit(c) for c in batch))
                    assert all(r.committed for r in results)
                    for p in (0, 1):
                        written[p] += 10

        load = asyncio.ensure_future(produce())
        await asyncio.sleep(0.5)
        replace = await asyncio.to_thread(
            subprocess.run,
            [
                sys.executable, "-m", "waltz_client.tools.cli", "cluster", "replace-storage",
                retiring, "--wait", "--timeout", "180",
                "--zookeeper", cluster.zookeeper_connect, "--root", cluster.layout.root,
            ],
            capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        stop.set()
        await load
        assert replace.returncode == 0, replace.stdout + replace.stderr
        assert f"{retiring} is replaced" in replace.stdout
        assert "get a replica on" in replace.stdout
        assert written[0] > 0 and written[1] > 0

    asyncio.run(scenario())
    doc = show_json(cluster)
    assert retiring not in doc["storages"]
    for p in ("0", "1"):
        assert len(doc["partitions"][p]["members"]) == 3
        assert retiring not in doc["partitions"][p]["members"]
    ordered = {p: read_all(cluster, p) for p in range(2)}
    assert all(len(v) > 0 for v in ordered.values())
    wait_for(
        lambda: assigned_logs_identical(cluster, range(2), ordered),
        120,
        "every assigned replica to hold the whole log",
    )


def test_a_replacement_survives_the_assigner_being_killed_midway(make_cluster):
    """The assigner is SIGKILLed while the new replicas are being copied (slowed down to
    make room for it): the other server becomes the assigner, carries the recorded
    replacement on to its end, and nothing committed is lost."""
    cluster = make_cluster(
        partitions=4,
        storages=4,
        servers=2,
        server_args=[
            "--replace-storage-after", "2",
            "--catch-up-inline-records", "0",
            "--catch-up-rate", "150000",
        ],
    )  # fmt: skip
    lost = cluster.layout.storage_addresses[3]
    asyncio.run(write_each(cluster, range(4), 300, b"x" * 1000))
    cluster.storages[3].kill()
    zk = cluster.zk_connect()
    try:

        def assigned_some() -> bool:
            record, _ = read_replacements(zk, cluster.layout.root)
            return any(e.action == "assigned" for e in record.events)

        wait_for(assigned_some, 120, "the first replacement step")
        record, _ = read_replacements(zk, cluster.layout.root)
        assert lost in record.replacing  # still copying: not finished
        assigner = min(admin.read_cluster(zk, cluster.layout.root).servers)
        cluster.servers[int(assigner.rsplit("-", 1)[1])].kill()
        wait_for(
            lambda: lost not in admin.read_assignment(zk, cluster.layout.root)[0].storages,
            180,
            f"{lost} to leave the assignment",
        )
        record, _ = read_replacements(zk, cluster.layout.root)
        assert lost not in record.replacing
        assert [e.action for e in record.events if e.storage == lost][-1] == "removed"
    finally:
        close(zk)
    ordered = {p: read_all(cluster, p) for p in range(4)}
    for p in range(4):
        assert sorted(ordered[p]) == sorted(b"%s-%d-%d" % (b"x" * 1000, p, i) for i in range(300))
    wait_for(
        lambda: assigned_logs_identical(cluster, range(4), ordered),
        120,
        "every assigned replica to hold the whole log",
    )
