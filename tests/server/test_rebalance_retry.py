"""A rebalance that fails is retried with backoff, without waiting for another membership
change, against a real ZooKeeper whose ownership node is made unwritable for a while.

The fault is a real one: an ACL on ``<root>/ownership`` that denies WRITE, so the
assigner's compare-and-set fails with ZooKeeper's own NoAuthError until the test puts
the open ACL back. Nothing of ours is mocked.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from kazoo.client import KazooClient
from kazoo.security import OPEN_ACL_UNSAFE, make_acl
from server_harness import ownership, until, wait_for

from waltz_client.cluster.admin import create_cluster, read_cluster
from waltz_client.cluster.metadata import ServerRegistration
from waltz_client.cluster.paths import ClusterPaths
from waltz_client.cluster.zk import close, connect
from waltz_server.coordinator import ServerCoordinator
from waltz_server.ownership import REBALANCE_RETRY_FIRST

pytestmark = pytest.mark.timeout(300)

# Hang guards only: every wait ends as soon as its condition holds.
GUARD = 120.0

FAILED = "rebalancing partitions failed"
RETRY_DELAY = re.compile(r"rebalancing partitions failed \(NoAuthError\); retrying in ([0-9.]+) s")


@contextmanager
def writes_denied(zk: KazooClient, path: str) -> Iterator[None]:
    """The fault: ``path`` may be read (and its ACL changed back) but not written."""
    zk.set_acls(path, [make_acl("world", "anyone", read=True, admin=True)])
    try:
        yield
    finally:
        allow_writes(zk, path)


def allow_writes(zk: KazooClient, path: str) -> None:
    zk.set_acls(path, OPEN_ACL_UNSAFE)


def membership_version(zk: KazooClient, servers_path: str) -> int:
    """Bumped by ZooKeeper on every registration and deregistration."""
    _, stat = zk.get_children(servers_path, include_data=True)
    return stat.cversion


# --- real server processes ---------------------------------------------------------------


def test_a_dead_servers_partitions_move_once_the_failing_write_succeeds(make_cluster):
    cluster = make_cluster(partitions=4, servers=2)
    before = wait_for(
        lambda: (
            (o := ownership(cluster))
            and {owner for owner, _ in o.values()} == {"server-0", "server-1"}
            and o
        ),
        GUARD,
        "both servers to own partitions",
    )
    paths = ClusterPaths.of(cluster.layout.root)
    with open(cluster.servers[0].log_path) as f:
        f.seek(0, 2)
        log_start = f.tell()

    def assigner_log() -> str:
        with open(cluster.servers[0].log_path) as f:
            f.seek(log_start)
            return f.read()

    zk = connect(cluster.zookeeper_connect)
    try:
        with writes_denied(zk, paths.ownership):
            # server-0 has the lowest ID: it writes the ownership once server-1's session
            # expires (4 s), and the write fails.
            cluster.servers[1].kill()
            wait_for(
                lambda: assigner_log().count(FAILED) >= 2,
                GUARD,
                "server-0 to retry the failed rebalance while writes are denied",
            )
            assert ownership(cluster) == before, "the fault did not stop the write"
            members = membership_version(zk, paths.servers)
        # The fault is gone. Nothing else happens: ownership must converge by itself.
        after = wait_for(
            lambda: (
                (o := ownership(cluster))
                and {owner for owner, _ in o.values()} == {"server-0"}
                and o
            ),
            GUARD,
            "the retried rebalance to give server-0 every partition",
        )
        assert membership_version(zk, paths.servers) == members, "membership changed"
    finally:
        close(zk)
    for p, (owner, generation) in before.items():
        assert after[p][1] == generation + (1 if owner == "server-1" else 0)
    text = assigner_log()
    assert "NoAuthError" in text, "the warning does not say what failed"
    assert re.search(r"retrying in [0-9.]+ s", text)
    assert "partition ownership rebalanced" in text
    assert "Traceback" not in text


# --- one coordinator in this process, against the shared ZooKeeper ----------------------


def rebalance_tasks() -> list[asyncio.Task]:
    return [
        t
        for t in asyncio.all_tasks()
        if getattr(t.get_coro(), "__qualname__", "").endswith("._rebalance_until_done")
    ]


def test_membership_changes_during_failing_retries_coalesce_into_one_task(
    zookeeper, zk_root, caplog
):
    caplog.set_level(logging.INFO, logger="waltz_server.coordinator")
    paths = ClusterPaths.of(zk_root)
    admin = connect(zookeeper.connect_string)
    create_cluster(admin, zk_root, "retry", 6, 1, ["127.0.0.1:9000"])

    def delays() -> list[float]:
        return [
            float(m.group(1))
            for r in caplog.records
            if r.levelno == logging.WARNING and (m := RETRY_DELAY.search(r.getMessage()))
        ]

    def owners() -> set[str | None]:
        return {owner for owner, _ in read_cluster(admin, zk_root).ownership.partitions.values()}

    async def scenario() -> None:
        coordinator = ServerCoordinator(
            zookeeper.connect_string, zk_root, ServerRegistration("s0", "127.0.0.1", 1, 2)
        )
        most_tasks = 0

        async def count_tasks() -> None:
            nonlocal most_tasks
            while True:
                most_tasks = max(most_tasks, len(rebalance_tasks()))
                await asyncio.sleep(0.005)

        counter = asyncio.create_task(count_tasks())
        try:
            with writes_denied(admin, paths.ownership):
                await coordinator.start()
                # Nothing else asks for a rebalance yet: the delays are the plain backoff.
                await until(lambda: len(delays()) >= 3, "three failed attempts")
                assert delays()[:3] == [REBALANCE_RETRY_FIRST * f for f in (1, 2, 4)]
                # Servers join (after s0, which stays the assigner) while it keeps failing.
                for name in ("s1", "s2", "s3"):
                    await asyncio.to_thread(
                        admin.create,
                        paths.server(name),
                        ServerRegistration(name, "127.0.0.1", 1, 2).encode(),
                        ephemeral=True,
                    )
                await until(lambda: coordinator.live_servers == ["s0", "s1", "s2", "s3"], "joins")
                failed_so_far = len(delays())
                await until(lambda: len(delays()) > failed_so_far, "an attempt after the joins")
                assert owners() == {None}, "the fault did not stop the write"
                members = await asyncio.to_thread(membership_version, admin, paths.servers)
            # The fault is gone: the retry alone brings ownership to all four servers.
            await until(
                lambda: owners() == {"s0", "s1", "s2", "s3"}, "ownership over the four servers"
            )
            assert await asyncio.to_thread(membership_version, admin, paths.servers) == members
            # Done: the task ends instead of lingering (or retrying) after a success.
            await until(lambda: not rebalance_tasks(), "the rebalance task to finish")
        finally:
            counter.cancel()
            await asyncio.wait({counter})
            await coordinator.stop()
        assert most_tasks == 1, f"{most_tasks} rebalance tasks at once"

    try:
        asyncio.run(scenario())
    finally:
        close(admin)
    assert any("partition ownership rebalanced" in r.getMessage() for r in caplog.records)
    # (A clean stop logs "session lost" at ERROR: kazoo reports LOST on close.)
    assert not [r for r in caplog.records if r.exc_info], "an unexpected exception"
