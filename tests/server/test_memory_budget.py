"""The server-wide memory budget: the owned partitions' caches shrink so that caches and
backlogs together stay within it (pure), the caches obey a new bound at once, and a real
server applies and reports it."""

from __future__ import annotations

import asyncio
import urllib.request

from server_harness import Put

from waltz_client import WaltzClient, WaltzClientConfig
from waltz_server.caches import DataCache, FeedCache
from waltz_server.memory_budget import MIN_FEED_CACHE_BYTES, partition_bounds

MiB = 1024 * 1024
DEFAULTS = {"feed_cache_bytes": 16 * MiB, "data_cache_bytes": 64 * MiB, "backlog_bytes": 64 * MiB}


def test_partitions_within_the_budget_keep_their_configured_caches():
    bounds = partition_bounds(2048 * MiB, 14, **DEFAULTS)
    assert (bounds.feed_cache_bytes, bounds.data_cache_bytes) == (16 * MiB, 64 * MiB)
    assert partition_bounds(1, 0, **DEFAULTS).total == 144 * MiB  # nothing owned yet


def test_more_partitions_get_smaller_caches_and_stay_within_the_budget():
    for partitions in (15, 20, 24, 27):
        bounds = partition_bounds(2048 * MiB, partitions, **DEFAULTS)
        assert bounds.total * partitions <= 2048 * MiB
        assert bounds.backlog_bytes == 64 * MiB  # backlogs keep appends flowing: fixed
        # Both caches shrink by the same factor.
        assert abs(bounds.data_cache_bytes / bounds.feed_cache_bytes - 4) < 0.01
    assert partition_bounds(512 * MiB, 4, **DEFAULTS).data_cache_bytes == int(64 * MiB * 0.8)


def test_caches_never_go_below_the_floor():
    bounds = partition_bounds(256 * MiB, 100, **DEFAULTS)
    assert bounds.feed_cache_bytes == MIN_FEED_CACHE_BYTES
    assert bounds.data_cache_bytes == 0


def test_a_smaller_bound_evicts_at_once():
    data = DataCache(10 * MiB)
    for txid in range(10):
        data.put(txid, bytes(MiB // 2))
    data.resize(2 * MiB)
    assert data.bytes <= 2 * MiB and data.get(9) is not None and data.get(0) is None
    feed = FeedCache(16 * MiB)
    for txid in range(50_000):
        feed.add(txid, bytes(24))
    feed.resize(256 * 1024)
    assert feed.bytes <= 256 * 1024
    assert feed.last == 49_999 and feed.get(49_990, 49_999) is not None


def metrics(cluster) -> dict[str, float]:
    port = cluster.servers[0].ready["http_port"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("waltz_server_memory_")
    }


def test_a_server_sizes_its_partitions_caches_by_the_budget(make_cluster):
    cluster = make_cluster(partitions=4, server_args=["--memory-budget-bytes", "512MiB"])
    config = WaltzClientConfig(cluster.zookeeper_connect, zk_root=cluster.layout.root, feed=False)

    async def load() -> None:
        async with WaltzClient(config) as client:
            assert all(
                await asyncio.gather(
                    *(client.submit(Put(bytes(4096), partition=i % 4)) for i in range(200))
                )
            )
            for p in range(4):
                async for _ in client.read(p, 0, 49):
                    pass

    asyncio.run(load())
    seen = metrics(cluster)
    assert seen["waltz_server_memory_budget_bytes"] == 512 * MiB
    # 4 partitions x (16 + 64 MiB caches + 64 MiB backlog) would be 576 MiB: caches at 0.8.
    assert seen["waltz_server_memory_cache_limit_bytes"] == int(16 * MiB * 0.8) + int(
        64 * MiB * 0.8
    )
    assert seen["waltz_server_memory_bounded_bytes"] <= 512 * MiB
    assert 0 < seen["waltz_server_memory_cache_bytes"] <= 4 * (16 + 64) * 0.8 * MiB
