"""Connections held open cannot lock legitimate peers out (issue 39, rows 2, 3 and 5),
against real daemon processes, with small caps set so that a few dozen sockets make the
point the issue made with thousands.

- Row 2: connections held after the hello used to fill a server's and a storage node's
  connection cap for good, so a client, or a server reconnecting to storage, was
  refused. Now one address holds at most ``max_connections_per_address``, and a
  connection not yet ready (no Open on storage, no first request on a server) gives
  its slot up to a newcomer, and is closed after ``handshake_timeout`` in any case.
- Row 3: on a TLS port a connection counted only once its handshake was done, so idle
  TCP connections were held past the cap, and a handshake trickled byte by byte lived
  for asyncio's 60 s. Now it counts from accept and its handshake has the deadline.
- Row 5: with all 256 slots of the HTTP port held, probes were refused. Now a probe
  takes the slot of the connection quiet the longest.

And a failed second Open closes a storage connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
import urllib.request

import pytest
from attack_helpers import (
    closed_within,
    connect_from,
    hello,
    open_sockets,
    opened_storage_peer,
    read_frame,
    ready_server_peer,
    start_storage,
)

from waltz_client import WaltzClient, WaltzClientConfig
from waltz_client.cluster.admin import read_params
from waltz_client.cluster.zk import close
from waltz_client.runtime.tls import TlsContexts, tls_open_connection
from waltz_client.tools.local.certs import local_pki
from waltz_client.transaction import TransactionBuilder, TransactionContext
from waltz_client.wire.framing import Service
from waltz_client.wire.records import Record, ReqId
from waltz_client.wire.storage_client import StorageClient
from waltz_client.wire.storage_messages import (
    FailureResponse,
    OpenRequest,
    StorageError,
    decode_response,
)

pytestmark = pytest.mark.timeout(240)

Peer = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class Put(TransactionContext):
    def partition(self, num_partitions: int) -> int:
        return 0

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_header(0)
        builder.set_data(b"served")
        return True


async def commits(cluster, timeout: float = 40.0) -> int:
    """A client on 127.0.0.1 commits one transaction; the partition's high-water mark."""
    config = WaltzClientConfig(cluster.zookeeper_connect, zk_root=cluster.layout.root, feed=False)
    async with asyncio.timeout(timeout):
        async with WaltzClient(config) as client:
            assert await client.submit(Put())
            return await client.high_water_mark(0)


async def many(make, count: int) -> list[Peer]:
    """``count`` peers made one after another; the ones the daemon let in."""
    peers = []
    for _ in range(count):
        peer = await make()
        if peer is not None:
            peers.append(peer)
    return peers


async def hello_only(address: str, port: int, service: Service) -> Peer | None:
    """A connection that does its hello, then nothing (None: refused)."""
    reader, writer = await connect_from(address, port)
    if await hello(reader, writer, service):
        return reader, writer
    writer.close()
    return None


def close_all(peers: list[Peer]) -> None:
    for _, writer in peers:
        writer.close()


def test_held_connections_lock_out_neither_servers_nor_clients(make_cluster):
    """Row 2, on a storage node (cap 12, 6 an address) and a server (cap 10, 4 an
    address): a stranger that knows the cluster key opens 12 storage connections from
    one address and strangers hold more after their hello from two others; the server,
    restarted, still reaches storage and commits. Then the same on the server's port:
    a client still commits, and the connections that never asked anything are closed
    after the 3 s deadline."""
    cluster = make_cluster(
        partitions=1,
        storages=1,
        storage_args=[
            *("--max-connections", "12", "--max-connections-per-address", "6"),
            *("--handshake-timeout", "60"),  # strangers hold on as long as they like
        ],
        server_args=[
            *("--max-connections", "10", "--max-connections-per-address", "4"),
            *("--handshake-timeout", "3"),
        ],
    )
    zk = cluster.zk_connect()
    try:
        key = read_params(zk, cluster.layout.root).key
    finally:
        close(zk)
    storage_port = cluster.storages[0].ready["port"]
    server = cluster.servers[0]
    server.stop()  # its storage connections close; it will have to make new ones

    async def storage_attack() -> tuple[list[Peer], list[Peer]]:
        opened = await many(lambda: opened_storage_peer("127.0.0.2", storage_port, key), 12)
        lurking = []
        for address in ("127.0.0.3", "127.0.0.4"):
            lurking += await many(lambda a=address: hello_only(a, storage_port, Service.STORAGE), 6)
        return opened, lurking

    async def server_attack(port: int) -> tuple[list[Peer], list[Peer]]:
        ready = await many(lambda: ready_server_peer("127.0.0.5", port), 6)
        lurking = []
        for address in ("127.0.0.6", "127.0.0.7"):
            lurking += await many(lambda a=address: hello_only(a, port, Service.SERVER), 5)
        return ready, lurking

    async def go() -> None:
        opened, lurking = await storage_attack()
        await asyncio.to_thread(server.start)
        assert await commits(cluster) == 0  # the server got back in: recovery, a commit
        assert len(opened) == 6  # the address cap
        close_all(opened + lurking)

        port = server.ready["port"]
        ready, lurking = await server_attack(port)
        started = time.monotonic()
        assert await commits(cluster) == 1
        assert len(ready) == 4
        # Never a first request: closed after the deadline (3 s, checked every second).
        for reader, _ in lurking:
            left = 3.0 + 5.0 - (time.monotonic() - started)
            assert await closed_within(reader, max(left, 0.5))
        for reader, _ in ready:  # ready connections stay, however idle
            assert not await closed_within(reader, 0.1)
        close_all(ready + lurking)

    asyncio.run(go())


def client_hello() -> bytes:
    """The first flight of a TLS client: its ClientHello."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    tls = context.wrap_bio(incoming, outgoing, server_side=False)
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def test_tls_connections_count_from_accept_and_handshakes_have_a_deadline(tmp_path):
    """Row 3, on a TLS storage node (cap 8, 2 s to be ready): 30 idle TCP connections
    leave it holding at most 8 sockets for them, a server's connection still gets in,
    Opens and appends, and handshakes trickled a byte at a time are closed by the
    deadline (they lived 60 s)."""
    hosts = ["127.0.0.1", "localhost"]
    pki = local_pki(str(tmp_path / "pki"), {"waltz-storage-0": hosts, "waltz-server-0": hosts})
    node, key = start_storage(
        tmp_path,
        *("--max-connections", "8", "--handshake-timeout", "2"),
        tls=pki["waltz-storage-0"],
    )
    assert node.pid is not None
    port = node.ready["port"]
    dial = tls_open_connection(TlsContexts(pki["waltz-server-0"], listening=False))

    async def go() -> None:
        base = open_sockets(node.pid)
        idle = [await connect_from(f"127.0.1.{i % 3}", port) for i in range(30)]
        await asyncio.sleep(0.5)
        held = open_sockets(node.pid) - base
        async with await StorageClient.connect("127.0.0.1", port, open_connection=dial) as good:
            await good.open(key, 1)
            await good.append(1, 0, [Record(0, ReqId(1, 1, 0, 0), 0, b"in")])
            assert await good.max_transaction_id(1, 0) == 0
        close_all(idle)

        first_flight = client_hello()
        trickling = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        started = time.monotonic()
        lived: list[float] = []

        async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            for byte in first_flight:  # one byte every 0.2 s: 100 s for all of it
                if time.monotonic() - started > 12.0:
                    break  # still open: enough to know
                try:
                    writer.write(bytes([byte]))
                    await writer.drain()
                except ConnectionError:
                    break
                if await closed_within(reader, 0.2):
                    break
            lived.append(time.monotonic() - started)

        async with asyncio.timeout(30):
            await asyncio.gather(*(trickle(r, w) for r, w in trickling))
        close_all(trickling)
        assert held <= 8 and max(lived) < 2.0 + 6.0, (
            f"{held} sockets held for 30 idle connections (cap 8); trickled handshakes "
            f"lived {[round(t, 1) for t in lived]} s (deadline 2 s)"
        )
        # Every slot came back: eight servers' connections fill the cap again.
        await asyncio.sleep(0.5)
        servers = [
            await StorageClient.connect("127.0.0.1", port, open_connection=dial) for _ in range(8)
        ]
        for client in servers:
            await client.open(key, 1)
        for client in servers:
            await client.close()

    try:
        asyncio.run(go())
    finally:
        node.stop()


def test_probes_get_through_when_every_http_slot_is_held(tmp_path):
    """Row 5: 256 connections hold the HTTP port's 256 slots (half idle, half with a
    request head never finished); ten probes of /healthz and /readyz are all answered."""
    node, _ = start_storage(tmp_path)
    http_port = node.ready["http_port"]

    def probe(path: str) -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}{path}", timeout=10) as r:
            return r.status

    async def go() -> list[int]:
        held = [await connect_from("127.0.0.2", http_port) for _ in range(256)]
        for _, writer in held[::2]:
            writer.write(b"GET /healthz HTTP/1.1\r\nHo")  # never finished
        await asyncio.sleep(0.5)
        answers = []
        for i in range(10):
            answers.append(await asyncio.to_thread(probe, "/healthz" if i % 2 else "/readyz"))
            await asyncio.sleep(0.1)
        close_all(held)
        return answers

    try:
        answers = asyncio.run(go())
    finally:
        node.stop()
    assert answers == [200] * 10


def test_a_failed_second_open_closes_the_storage_connection(tmp_path):
    """Opened with the cluster key, then an Open that fails: the Failure, then the close
    (it used to stay open and opened)."""
    node, key = start_storage(tmp_path)
    port = node.ready["port"]

    async def go() -> None:
        peer = await opened_storage_peer("127.0.0.1", port, key)
        assert peer is not None
        reader, writer = peer
        writer.write(OpenRequest(-1, 7, -1, key, 2).encode())  # the wrong partition count
        body = await read_frame(reader)
        failure = decode_response(body[0], body[1:])
        assert isinstance(failure, FailureResponse)
        assert failure.error == StorageError.PARTITION_COUNT_MISMATCH
        assert await closed_within(reader, 10)
        writer.close()

    try:
        asyncio.run(go())
    finally:
        node.stop()
