"""Helpers shared by the link-cut fault tests: the daemons' HTTP endpoints, appending
through a fault, settling, and checking the log every reader saw. The protocol-level
``PartitionClient`` and ``replica_logs`` are the server tests' (tests/server/
server_harness.py), loaded by path: that folder is not on ``sys.path`` here."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import time
import urllib.error
import urllib.request

from waltz_client.wire.server_connection import ServerConnectionClosed

log = logging.getLogger(__name__)


def _load_server_harness():
    path = os.path.join(os.path.dirname(__file__), os.pardir, "server", "server_harness.py")
    spec = importlib.util.spec_from_file_location("server_harness", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_server = _load_server_harness()
PartitionClient = _server.PartitionClient
replica_logs = _server.replica_logs
wait_for = _server.wait_for
owner_of = _server.owner_of


def http_json(proc, path: str) -> tuple[int, dict]:
    """(status, JSON body) of a daemon's HTTP endpoint, (0, {}) if it does not answer."""
    url = f"http://127.0.0.1:{proc.ready['http_port']}{path}"
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")
    except (OSError, ValueError):
        return 0, {}


def partition_health(proc, partition: int) -> dict:
    """The server's /healthz entry for the partition ({} if it does not own it)."""
    return http_json(proc, "/healthz")[1].get("partitions", {}).get(str(partition), {})


async def keep_appending(
    client: PartitionClient, stop: asyncio.Event, tag: bytes, stall: float = 3.0
) -> int:
    """Append bursts of 10 every 50 ms until ``stop``. Mount again (at whichever server
    ZooKeeper names) when the connection closes, the feed is suspended, or the feed has
    not moved for ``stall`` seconds: the server may still be up but unable to commit."""
    sent = 0
    last_mark, moved_at = client.high_water_mark, time.monotonic()
    while not stop.is_set():
        now = time.monotonic()
        if client.high_water_mark != last_mark:
            last_mark, moved_at = client.high_water_mark, now
        if client.conn is None or client.conn.closed or client.suspended or now - moved_at > stall:
            client.suspended.clear()
            try:
                await client.mount(timeout=5)
            except (AssertionError, ServerConnectionClosed, ConnectionError):
                await asyncio.sleep(0.3)
                continue
            finally:
                moved_at = time.monotonic()
        try:
            for _ in range(10):
                client.append(tag + b"-%d" % sent)
                sent += 1
        except (ServerConnectionClosed, ConnectionError):
            pass
        await asyncio.sleep(0.05)
    return sent


async def settle(client: PartitionClient, attempts: int = 10) -> None:
    """Mount again if needed and flush, until a Flush is answered (at most ``attempts``)."""
    for _ in range(attempts):
        try:
            if client.conn is None or client.conn.closed or client.suspended:
                client.suspended.clear()
                await client.mount(timeout=30)
            await client.flush(timeout=20)
            return
        except (AssertionError, ServerConnectionClosed, ConnectionError, TimeoutError):
            await asyncio.sleep(0.5)
    raise AssertionError("the partition never answered a Flush")


def check_log(cluster, partition: int, feeds: list[list]) -> list:
    """With the cluster stopped: every replica holds the same records, transaction IDs
    0..n-1, no ReqId twice, and every header any client saw on a feed at its place."""
    logs = replica_logs(cluster, partition)
    for i, records in enumerate(logs):
        assert [r.transaction_id for r in records] == list(range(len(records))), f"storage-{i}"
        assert records == logs[0], f"storage-{i} differs from storage-0"
    stored = {r.transaction_id: r.req_id for r in logs[0]}
    for feed in feeds:
        for header in feed:
            assert stored.get(header.transaction_id) == header.req_id, (
                f"acknowledged transaction {header.transaction_id} lost or replaced"
            )
    req_ids = [r.req_id for r in logs[0]]
    assert len(req_ids) == len(set(req_ids)), "an append was committed twice"
    return logs[0]
