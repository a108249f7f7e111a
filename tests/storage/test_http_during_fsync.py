"""A metrics scrape or a probe never waits for a partition's fsync.

A partition's lock is held across its group-commit fsync, which can take seconds on a
slow disk. Had ``/metrics`` waited for that lock, it would have stalled every partition
and the probes. And a small write group runs on the node's event loop's own thread,
fsync included, so the HTTP endpoints run on a thread of their own (``HttpThread``), as
in the daemon. Here a node runs in this process on a loop of its own thread, partition
0's fsync is held on an Event, and the HTTP endpoints must answer meanwhile, whether the
group is on the I/O thread or on the loop's.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from waltz_client.runtime.daemon import HttpThread
from waltz_client.wire.records import Record, ReqId
from waltz_client.wire.storage_client import StorageClient
from waltz_storage.http import build_app
from waltz_storage.server import ServerSettings, StorageServer
from waltz_storage.service import StorageNode

HOST = "127.0.0.1"
SESSION = 1
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_get(port: int, path: str, timeout: float) -> tuple[int, str]:
    try:
        with _NO_PROXY.open(f"http://{HOST}:{port}{path}", timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def partition_gauge(text: str, name: str, partition: str) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == f"waltz_storage_partition_{name}" and s.labels == {"partition": partition}:
                return s.value
    raise AssertionError(f"no {name} for partition {partition}")


@pytest.mark.parametrize("inline", [True, False], ids=["on-the-loop", "on-the-io-thread"])
def test_metrics_and_probes_answer_while_an_fsync_is_blocked(
    tmp_path: Path, monkeypatch, inline: bool
):
    key = uuid.uuid4()
    node = StorageNode.open(str(tmp_path / "data"), key, 2, {0, 1})
    server = StorageServer(node, ServerSettings(inline_group_max_seconds=60.0 if inline else 0))
    http = HttpThread()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="storage-loop", daemon=True)
    thread.start()

    def on_loop(coro: Coroutine[Any, Any, Any], timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)

    in_fsync, release = threading.Event(), threading.Event()
    partition_log = node.partitions[0].log
    assert partition_log is not None
    real_sync = partition_log.sync

    def blocked_sync(*args: Any) -> None:
        in_fsync.set()
        release.wait(120)
        real_sync(*args)

    monkeypatch.setattr(partition_log, "sync", blocked_sync)

    async def start() -> tuple[int, int]:
        port = await server.start(HOST, 0)
        return port, await http.start(build_app(server), HOST, 0)

    async def append(port: int, partition: int, n: int) -> None:
        async with await StorageClient.connect(HOST, port) as client:
            await client.open(key, 2)
            await client.append(
                SESSION,
                partition,
                [Record(t, ReqId(1, 1, partition, t), 0, b"x" * 100) for t in range(n)],
            )

    port, http_port = on_loop(start())
    try:
        pending = asyncio.run_coroutine_threadsafe(append(port, 0, 5), loop)
        assert in_fsync.wait(30), "the append never reached its fsync"
        try:
            # The fsync is held until `release`: everything below happens during it.
            status, text = http_get(http_port, "/metrics", timeout=15)
            assert status == 200
            # The state published before the call that is still in its fsync.
            assert partition_gauge(text, "max_transaction_id", "0") == -1
            assert partition_gauge(text, "available", "0") == 1
            status, body = http_get(http_port, "/healthz", timeout=15)
            assert (status, json.loads(body)["status"]) == (200, "ok")
            status, body = http_get(http_port, "/readyz", timeout=15)
            assert (status, json.loads(body)["ready"]) == (200, True)
            # Another partition's append waits: the partitions share the node's I/O
            # thread (and its disk), but it is queued, not refused.
            other = asyncio.run_coroutine_threadsafe(append(port, 1, 3), loop)
            status, _ = http_get(http_port, "/healthz", timeout=15)
            assert status == 200
            assert not pending.done()
            assert not other.done()
            assert not release.is_set()
        finally:
            release.set()
        pending.result(30)
        other.result(30)
        assert (server.worker.inline_groups > 0) == inline
        text = http_get(http_port, "/metrics", timeout=15)[1]
        assert partition_gauge(text, "max_transaction_id", "0") == 4
        assert partition_gauge(text, "max_transaction_id", "1") == 2
    finally:
        release.set()
        on_loop(server.close())
        on_loop(http.stop())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()
        node.close()
