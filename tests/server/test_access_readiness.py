"""A server that has not read the cluster's access policy yet answers NOT_READY (which
clients retry), never FORBIDDEN, and is not ready (/readyz 503, no ready file).

A server opens its client port before it reaches ZooKeeper (its registration names the
bound port). It used to refuse everyone meanwhile: restarting a server under load made
thousands of appends fail with FORBIDDEN on a cluster with no access policy at all.
Real processes and ZooKeeper; the window is made as long as the test needs by starting
the server on a cluster root that does not exist yet (it waits for the cluster there).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from waltz_client import SubmitStatus, WaltzClient, WaltzClientConfig
from waltz_client.cluster.admin import create_cluster
from waltz_client.cluster.zk import close, connect
from waltz_client.tools.local.cluster import _free_port
from waltz_client.transaction import TransactionBuilder, TransactionContext
from waltz_client.wire.client_messages import (
    SERVER_PROTOCOL_VERSIONS,
    AppendRequest,
    ErrorCode,
    ErrorResponse,
    FeedRequest,
    HighWaterMarkRequest,
    MountRequest,
    MountResponse,
    MountStatus,
    decode_server_response,
)
from waltz_client.wire.framing import (
    HANDSHAKE_BYTES,
    FrameDecoder,
    HandshakeStatus,
    Hello,
    HelloReply,
    Service,
)
from waltz_client.wire.records import ReqId

pytestmark = pytest.mark.timeout(300)


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def client_errors(http_port: int) -> dict[str, float]:
    """waltz_server_client_errors_total by kind."""
    _, text = http_get(http_port, "/metrics")
    out = {}
    for line in text.splitlines():
        if line.startswith("waltz_server_client_errors_total{"):
            kind = line.split('kind="', 1)[1].split('"', 1)[0]
            out[kind] = float(line.split()[-1])
    return out


def start_server(zookeeper: str, root: str, port: int, http_port: int, log: str):
    """A server process on these ports that writes no ready file (it may never be
    ready); the caller waits for its port."""
    command = [
        sys.executable,
        "-m",
        "waltz_server.main",
        "--zookeeper",
        zookeeper,
        "--zk-root",
        root,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--http-port",
        str(http_port),
        "--server-id",
        "server-0",
    ]
    with open(log, "ab") as out:
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )


def log_tail(log: str) -> str:
    with open(log, errors="replace") as f:
        return f.read()[-3000:]


def wait_listening(proc: subprocess.Popen, http_port: int, log: str) -> None:
    deadline = time.monotonic() + 60  # a hang guard: it listens within a second or two
    while True:
        assert proc.poll() is None, log_tail(log)
        try:
            http_get(http_port, "/readyz")
            return
        except OSError:
            if time.monotonic() > deadline:
                raise AssertionError("the server never listened") from None
            time.sleep(0.05)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


async def handshake(port: int):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    low, high = min(SERVER_PROTOCOL_VERSIONS), max(SERVER_PROTOCOL_VERSIONS)
    writer.write(Hello(Service.SERVER, low, high).encode())
    assert HelloReply.decode(await reader.readexactly(HANDSHAKE_BYTES)).status == (
        HandshakeStatus.OK
    )
    return reader, writer


async def answers(reader, count: int) -> list:
    decoder = FrameDecoder(1 << 20)
    out: list = []
    async with asyncio.timeout(60):  # a hang guard
        while len(out) < count:
            data = await reader.read(1 << 16)
            assert data, f"closed after {len(out)} answers"
            out += [decode_server_response(t, b, 1 << 20) for t, b in decoder.feed(data)]
    return out


def test_before_the_policy_is_read_requests_answer_not_ready(zookeeper, zk_root, tmp_path):
    taken: set[int] = set()
    port, http_port = _free_port(taken), _free_port(taken)
    log = str(tmp_path / "server.log")
    proc = start_server(zookeeper.connect_string, zk_root, port, http_port, log)
    try:
        wait_listening(proc, http_port, log)
        status, body = http_get(http_port, "/readyz")
        assert status == 503 and json.loads(body)["access_policy_read"] is False, body

        async def requests(partition: int) -> list:
            reader, writer = await handshake(port)
            q = [ReqId(7, 1, partition, seq) for seq in range(4)]
            writer.write(
                AppendRequest(q[0], -1, (), (), (), 0, b"x").encode()
                + MountRequest(q[1], -1, 0).encode()
                + FeedRequest(q[2], -1).encode()
                + HighWaterMarkRequest(q[3]).encode()
            )
            got = await answers(reader, 3)
            writer.close()
            return got

        # The cluster is not there yet, so no policy: retry, not FORBIDDEN.
        got = asyncio.run(requests(5))
        assert [(type(m), m.code) for m in got] == [(ErrorResponse, ErrorCode.NOT_READY)] * 3
        assert [m.req_id.seq for m in got] == [1, 2, 3]  # the append is dropped
        assert "not read the cluster's access policy" in got[0].message
        assert client_errors(http_port).get("not_ready") == 4
        assert "forbidden" not in client_errors(http_port)

        # Once the cluster exists the server reads it (no policy: open) and is ready;
        # the same requests now reach the partition lookup (partition 5 is no one's).
        zk = connect(zookeeper.connect_string)
        try:
            create_cluster(zk, zk_root, "readiness", 1, 1, ["127.0.0.1:1"])
        finally:
            close(zk)
        deadline = time.monotonic() + 60  # a hang guard: the server retries every 2 s
        while http_get(http_port, "/readyz")[0] != 200:
            assert time.monotonic() < deadline, log_tail(log)
            time.sleep(0.1)
        assert json.loads(http_get(http_port, "/readyz")[1])["access_policy_read"] is True
        got = asyncio.run(requests(5))
        assert isinstance(got[0], MountResponse) and got[0].status == MountStatus.NOT_OWNER
        assert [m.code for m in got[1:]] == [ErrorCode.NOT_OWNER] * 2
    finally:
        stop(proc)


class Put(TransactionContext):
    def __init__(self, data: bytes) -> None:
        self.data = data

    def partition_id(self, num_partitions: int) -> int:
        return 0

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_header(0)
        builder.set_data(self.data)
        return True


async def until(predicate, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout  # a hang guard
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def test_a_client_under_load_sees_no_forbidden_while_its_server_restarts(make_cluster):
    """Appends from a real client while the server is killed, replaced by one that
    cannot read the policy yet (it listens on the same port, on a cluster root it cannot
    find), then restarted for real, twice. The client must hit the not-ready server
    (its metrics count the requests it told to retry), and every append commits."""
    # A long session timeout keeps the killed server's registration, so the client
    # keeps dialling its port (where the not-ready server then listens).
    cluster = make_cluster(partitions=1, server_args=["--zk-session-timeout", "30"])
    server = cluster.servers[0]
    port, http_port = server.ready["port"], server.ready["http_port"]
    config = WaltzClientConfig(cluster.zookeeper_connect, zk_root=cluster.layout.root, feed=False)
    log = os.path.join(cluster.data_dir, "not-ready-server.log")

    seen: dict[str, float] = {}  # the not-ready server's client_errors_total by kind

    async def go() -> tuple[list, list[bytes]]:
        results: list = []
        stopping = asyncio.Event()
        async with WaltzClient(config) as client:

            async def producer(i: int) -> None:
                n = 0
                while not stopping.is_set():
                    results.append(await client.submit(Put(b"%d-%d" % (i, n))))
                    n += 1

            producers = [asyncio.create_task(producer(i)) for i in range(4)]
            await until(lambda: len(results) >= 20, "the first commits")
            await asyncio.to_thread(server.kill)
            impostor = start_server(
                cluster.zookeeper_connect, cluster.layout.root + "-not-yet", port, http_port, log
            )
            try:
                await asyncio.to_thread(wait_listening, impostor, http_port, log)
                hwm = asyncio.create_task(client.high_water_mark(0))  # an RPC meanwhile

                def hit() -> bool:
                    seen.update(client_errors(http_port))
                    return seen.get("not_ready", 0) + seen.get("forbidden", 0) >= 2

                await until(hit, "the client's requests at the not-ready server")
            finally:
                await asyncio.to_thread(stop, impostor)
            await asyncio.to_thread(server.start)
            for restart in range(3):  # plain restarts under load as well, then commits
                done = len(results)
                await until(lambda d=done: len(results) >= d + 20, "commits after a restart")
                if restart < 2:
                    await asyncio.to_thread(server.restart)
            stopping.set()
            await asyncio.gather(*producers)
            assert await hwm >= 19
            read = [r.data async for r in client.read(0)]
        return results, read

    results, read = asyncio.run(go())
    failed = [r for r in results if r.status != SubmitStatus.COMMITTED]
    assert not failed, failed[:3]
    assert seen.get("not_ready", 0) >= 2 and "forbidden" not in seen, seen
    assert len(read) == len(results) == len(set(read))  # every append once, no other
