"""Retention on a real cluster: the policy in ZooKeeper moves a partition's log start up,
storage nodes delete whole segments below it, every read below it is refused with the
first available ID, a replaced disk is copied only from the log start, and what is
kept stays identical on every replica.

Small segments (4 KiB) and a retention step every half second keep it quick.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time

import pytest
from server_harness import Put, cluster_admin, partition_metadata, replica_logs, wait_for
from test_server_bounds import raw_connect, read_messages

from waltz_client import (
    MissingTransactions,
    SubmitStatus,
    WaltzClient,
    WaltzClientCallbacks,
    WaltzClientConfig,
)
from waltz_client.cluster import admin
from waltz_client.cluster.retention import RetentionRule
from waltz_client.wire.client_messages import ErrorCode, ErrorResponse, MountRequest
from waltz_client.wire.records import ReqId

pytestmark = pytest.mark.timeout(300)


def payload(i: int) -> bytes:
    return i.to_bytes(4, "big") * 256  # 1 KiB, different per transaction


def config(cluster) -> WaltzClientConfig:
    return WaltzClientConfig(cluster.zookeeper_connect, zk_root=cluster.layout.root, feed=False)


async def append(cluster, first: int, count: int) -> None:
    async with WaltzClient(config(cluster)) as client:
        results = await asyncio.gather(
            *(client.submit(Put(payload(i))) for i in range(first, first + count))
        )
        assert all(r.committed for r in results), [r for r in results if not r.committed]


def segment_firsts(cluster, storage: int) -> list[int]:
    directory = os.path.join(cluster.data_dir, f"storage-{storage}", "0")
    return sorted(int(n[:19]) for n in os.listdir(directory) if n.endswith(".seg"))


def log_start(cluster) -> int:
    return partition_metadata(cluster, 0).log_start


@pytest.fixture
def cluster(make_cluster):
    return make_cluster(
        partitions=1,
        storage_args=["--segment-bytes", "4096"],
        server_args=["--retention-interval", "0.5"],
    )


def test_size_retention_deletes_segments_and_reads_below_the_start_are_refused(cluster):
    asyncio.run(append(cluster, 0, 200))
    # A commit needs two of the three replicas: storage-0 may still be catching up.
    segments_before = wait_for(
        lambda: (firsts := segment_firsts(cluster, 0)) and len(firsts) > 40 and firsts,
        60,
        "storage-0 to hold all 200 transactions in more than 40 segments",
    )

    cluster_admin(
        cluster,
        admin.update_retention,
        lambda p: p.with_rule([None], RetentionRule(max_bytes=20_000)),
    )
    start = wait_for(lambda: log_start(cluster), what="the log start to move")
    for i in range(3):  # every replica deletes what is wholly below the start
        wait_for(lambda i=i: segment_firsts(cluster, i)[1] > start, what=f"storage-{i} to delete")
        assert segment_firsts(cluster, i)[0] <= start
        assert len(segment_firsts(cluster, i)) < len(segments_before) // 2

    async def reads() -> None:
        async with WaltzClient(config(cluster)) as client:
            with pytest.raises(MissingTransactions) as gone:
                await client.transaction_data(0, start - 1)
            assert gone.value.first_available == start
            assert f"the first available is {start}" in str(gone.value)
            with pytest.raises(MissingTransactions) as gone:
                async for _ in client.read(0, 0, 199):
                    pass
            assert gone.value.first_available == start
            kept = [r async for r in client.read(0, start, 199)]
            assert [r.data for r in kept] == [payload(i) for i in range(start, 200)]
            assert await client.transaction_data(0, start) == payload(start)
            # Appends go on, after the deletion.
            assert await client.submit(Put(payload(200)))
            assert await client.high_water_mark(0) == 200

    asyncio.run(reads())

    # A mount from before the start is refused, naming it: the application cannot be
    # brought up to date from the log any more.
    async def mount_from_scratch() -> ErrorResponse:
        reader, writer = await raw_connect(cluster)
        generation = cluster.ownership()[0][1]
        writer.write(MountRequest(ReqId(77, generation, 0, 1), -1, 1).encode())
        (answer,) = await read_messages(reader, 1)
        writer.close()
        return answer

    answer = asyncio.run(mount_from_scratch())
    assert isinstance(answer, ErrorResponse) and answer.code == ErrorCode.TRUNCATED
    assert f"first available is {start}" in answer.message

    # Through the client: an application at -1 cannot append to that partition, and the
    # submission says why.
    class FromScratch(WaltzClientCallbacks):
        def client_high_water_mark(self, partition_id: int) -> int:
            return -1

        def apply_transaction(self, transaction) -> None:
            raise AssertionError("nothing below the log start can be delivered")

    async def submit_from_scratch():
        config = WaltzClientConfig(
            cluster.zookeeper_connect, zk_root=cluster.layout.root, partitions=[0]
        )
        async with WaltzClient(config, FromScratch()) as client:
            return await client.submit(Put(payload(999)))

    result = asyncio.run(submit_from_scratch())
    assert result.status == SubmitStatus.FAILED
    assert result.reason.startswith("mount refused: MissingTransactions(")


def test_truncate_before_a_replaced_disk_and_a_restart(cluster):
    asyncio.run(append(cluster, 0, 120))
    cluster_admin(cluster, admin.update_retention, lambda p: p.truncated_before(0, 90))
    wait_for(lambda: log_start(cluster) == 90, what="the log start to reach 90")

    # storage-2 loses its disk; it comes back empty and is copied from the log start.
    cluster.storages[2].stop()
    shutil.rmtree(os.path.join(cluster.data_dir, "storage-2", "0"))
    cluster.storages[2].start()
    asyncio.run(append(cluster, 120, 30))

    def replaced_copied() -> bool:
        firsts = segment_firsts(cluster, 2)
        return bool(firsts) and firsts[0] == 90

    wait_for(replaced_copied, timeout=60, what="storage-2 to start at 90")
    asyncio.run(append(cluster, 150, 10))
    time.sleep(1)  # a last step: every replica saw it
    cluster.stop()
    logs = replica_logs(cluster, 0)
    for records in logs:
        kept = [r for r in records if r.transaction_id >= 90]
        assert [r.transaction_id for r in kept] == list(range(90, 160))
        assert [r.data for r in kept] == [payload(i) for i in range(90, 160)]
    assert min(r.transaction_id for r in logs[2]) == 90  # nothing below it was copied

    # Restarted, every node opens its shortened partition and the log start holds.
    cluster.start()

    async def after_restart() -> None:
        async with WaltzClient(config(cluster)) as client:
            assert await client.transaction_data(0, 159) == payload(159)
            with pytest.raises(MissingTransactions):
                await client.transaction_data(0, 89)
            assert await client.submit(Put(payload(160)))

    asyncio.run(after_restart())


def test_age_retention_keeps_the_segment_being_written(cluster):
    asyncio.run(append(cluster, 0, 60))
    time.sleep(2.5)
    asyncio.run(append(cluster, 60, 2))
    cluster_admin(
        cluster,
        admin.update_retention,
        lambda p: p.with_rule([0], RetentionRule(max_age_seconds=2)),
    )
    start = wait_for(lambda: log_start(cluster), what="the log start to move")
    assert 50 < start <= 62  # only the last (active) segment, written just now, stays
    wait_for(lambda: len(segment_firsts(cluster, 0)) <= 2, what="old segments to go")


def test_age_retention_goes_by_the_commit_times_not_the_files(cluster):
    """Segment files a catch-up copy or a restore rewrote are new; their transactions are
    not. Retention by age goes by the transactions' own commit times."""
    asyncio.run(append(cluster, 0, 60))
    time.sleep(2.5)
    asyncio.run(append(cluster, 60, 2))
    now = time.time()
    for i in range(3):
        directory = os.path.join(cluster.data_dir, f"storage-{i}", "0")
        for name in os.listdir(directory):
            os.utime(os.path.join(directory, name), (now, now))  # every file "just written"
    cluster_admin(
        cluster,
        admin.update_retention,
        lambda p: p.with_rule([0], RetentionRule(max_age_seconds=2)),
    )
    start = wait_for(lambda: log_start(cluster), what="the log start to move")
    assert 50 < start <= 62
