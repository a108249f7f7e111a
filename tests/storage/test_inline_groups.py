"""Small write groups run on the event loop's own thread while the disk is fast.

Handing a group to the I/O thread and back costs two thread wakes and the GIL changing
hands; ``runs_inline`` decides when to skip that: never for range reads, never once a
group took longer than ``inline_group_max_seconds`` (a slow disk: the loop must stay
free), never when it is 0. Here a real node serves real sockets in this process.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest

from waltz_client.wire.records import Record, ReqId
from waltz_client.wire.storage_client import StorageClient
from waltz_client.wire.storage_messages import (
    AppendRequest,
    MaxTransactionIdRequest,
    RecordHeaderListRequest,
    RecordListRequest,
    RecordRequest,
)
from waltz_storage.config import ConfigError, load_config
from waltz_storage.server import (
    INLINE_GROUP_MAX_BYTES,
    ServerSettings,
    StorageServer,
    runs_inline,
)
from waltz_storage.service import StorageNode

SESSION = 3
HOST = "127.0.0.1"


def records(first: int, n: int) -> list[Record]:
    return [Record(t, ReqId(1, 1, 0, t), 0, b"x" * 64) for t in range(first, first + n)]


def test_the_decision() -> None:
    append = AppendRequest(SESSION, 1, 0)
    ask = MaxTransactionIdRequest(SESSION, 2, 0)
    writes = [(None, append), (None, ask)]
    small = 4096
    assert runs_inline(writes, small, 0.001, 0.005)  # type: ignore[arg-type]
    assert runs_inline(writes, small, 0.005, 0.005)  # type: ignore[arg-type]
    assert runs_inline(writes, INLINE_GROUP_MAX_BYTES, 0.0, 0.005)  # type: ignore[arg-type]
    assert not runs_inline(writes, INLINE_GROUP_MAX_BYTES + 1, 0.0, 0.005)  # type: ignore[arg-type]
    assert not runs_inline(writes, small, 0.0051, 0.005)  # type: ignore[arg-type]  # slow disk
    assert not runs_inline(writes, small, 0.0, 0.0)  # type: ignore[arg-type]  # turned off
    for read in (
        RecordListRequest(SESSION, 3, 0, 0, 10),
        RecordHeaderListRequest(SESSION, 3, 0, 0, 10),
        RecordRequest(SESSION, 3, 0, 0),
    ):
        assert not runs_inline([*writes, (None, read)], small, 0.0, 0.005)  # type: ignore[arg-type]


def standalone(tmp_path: Path) -> list[str]:
    return [
        "--directory",
        str(tmp_path),
        "--cluster-key",
        str(uuid.uuid4()),
        "--num-partitions",
        "1",
    ]


def test_the_daemon_setting_is_in_milliseconds(tmp_path: Path) -> None:
    base = standalone(tmp_path)
    assert load_config(base, {}).inline_group_max_ms == 5.0
    assert load_config([*base, "--inline-group-max-ms", "0"], {}).inline_group_max_ms == 0.0
    env = {"WALTZ_STORAGE_INLINE_GROUP_MAX_MS": "12.5"}
    assert load_config(base, env).inline_group_max_ms == 12.5


@pytest.mark.parametrize("bad", ["-1", "soon", "60001"])
def test_a_bad_setting_is_refused(tmp_path: Path, bad: str) -> None:
    base = standalone(tmp_path)
    with pytest.raises(ConfigError, match="inline_group_max_ms"):
        load_config([*base, "--inline-group-max-ms", bad], {})


def inline_counts_after_each(
    node: StorageNode, server: StorageServer, key: uuid.UUID, batches: list, before_each=None
) -> list[int]:
    """Append each batch of records in turn on a real connection to ``server``; the
    worker's inline group count after each (``before_each(i)`` runs first)."""

    async def go() -> list[int]:
        port = await server.start(HOST, 0)
        seen = []
        try:
            async with await StorageClient.connect(HOST, port) as client:
                await client.open(key, 1)
                for i, batch in enumerate(batches):
                    if before_each is not None:
                        before_each(i)
                    await client.append(SESSION, 0, batch)
                    seen.append(server.worker.inline_groups)
                last = batches[-1][-1].transaction_id
                assert await client.max_transaction_id(SESSION, 0) == last
        finally:
            await server.close()
        return seen

    try:
        return asyncio.run(go())
    finally:
        node.close()


def test_a_slow_group_sends_the_next_to_the_io_thread(tmp_path: Path) -> None:
    """Fast appends run inline; one that took longer than the bound (a sync held for
    1 s) makes the next group go to the I/O thread; once groups are fast again, they
    run inline again. Every append is answered and stored either way. The bound is wide
    (0.3 s) so that a busy machine's ordinary fsync never crosses it."""
    key = uuid.uuid4()
    node = StorageNode.open(str(tmp_path / "data"), key, 1, {0})
    server = StorageServer(node, ServerSettings(inline_group_max_seconds=0.3))
    partition_log = node.partitions[0].log
    assert partition_log is not None
    real_sync = partition_log.sync
    slow_at = 2

    def sync(*args: object) -> None:
        if slow["now"]:
            time.sleep(1.0)
        real_sync(*args)

    slow = {"now": False}
    partition_log.sync = sync  # type: ignore[method-assign]
    batches = [records(2 * i, 2) for i in range(5)]
    seen = inline_counts_after_each(
        node, server, key, batches, lambda i: slow.update(now=i == slow_at)
    )
    # Groups 1-3 inline (the third is the slow one); the fourth, after it, on the I/O
    # thread (whose wall time is short again); the fifth inline again.
    assert seen == [1, 2, 3, 3, 4]


def test_a_large_group_runs_on_the_io_thread(tmp_path: Path) -> None:
    key = uuid.uuid4()
    node = StorageNode.open(str(tmp_path / "data"), key, 1, {0})
    big = [Record(t, ReqId(1, 1, 0, t), 0, b"y" * 4096) for t in range(300)]  # 1.2 MiB
    # A wide time bound: only the size rule decides here, however slow the big group's
    # fsync is on a busy machine.
    server = StorageServer(node, ServerSettings(inline_group_max_seconds=60.0))
    seen = inline_counts_after_each(node, server, key, [big, records(300, 2)])
    # Open is answered on the loop, not by the worker: the counts are appends only.
    assert seen == [0, 1]


def test_new_sessions_are_read_for_while_the_group_before_them_syncs(tmp_path: Path) -> None:
    """A recovering server's votes reach a node busy with a group (its sync held for 1 s
    here): their sessions are read as they arrive, on a thread of their own, while that
    group still syncs, so their own group reads nothing and waits on no ZooKeeper."""
    key = uuid.uuid4()
    partitions = {0, 1, 2, 3, 4}
    node = StorageNode.open(str(tmp_path / "data"), key, 5, partitions)
    single: list[int] = []
    batches: list[tuple[list[int], float]] = []

    def read_one(p: int) -> int:
        single.append(p)
        return SESSION

    def read_many(ps: list[int]) -> dict[int, int]:
        batches.append((sorted(ps), time.monotonic()))
        return dict.fromkeys(ps, SESSION)

    node.verify_sessions_with(read_one, read_many=read_many)
    server = StorageServer(node, ServerSettings(inline_group_max_seconds=0.0))
    partition_log = node.partitions[0].log
    assert partition_log is not None
    real_sync = partition_log.sync
    sync_ended: list[float] = []

    def slow_sync(*args: object) -> None:
        time.sleep(1.0)
        real_sync(*args)
        sync_ended.append(time.monotonic())

    async def go() -> None:
        port = await server.start(HOST, 0)
        try:
            async with await StorageClient.connect(HOST, port) as client:
                await client.open(key, 5)
                await client.max_transaction_id(SESSION, 0)  # partition 0 fenced first
                single.clear()
                batches.clear()
                partition_log.sync = slow_sync  # type: ignore[method-assign]
                append = asyncio.ensure_future(client.append(SESSION, 0, records(0, 2)))
                await asyncio.sleep(0.2)  # its group is syncing
                votes = [client.last_session_info(SESSION, p) for p in (1, 2, 3, 4)]
                infos = await asyncio.gather(*votes)
                await append
                assert [i.last_session_id for i in infos] == [-1] * 4
        finally:
            await server.close()

    try:
        asyncio.run(go())
    finally:
        node.close()
    assert [b for b, _ in batches] == [[1, 2, 3, 4]] and single == []
    assert batches[0][1] < sync_ended[0]  # read while the group before them synced
    assert all(node.partitions[p].info.fence_session_id == SESSION for p in (1, 2, 3, 4))
