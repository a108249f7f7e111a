"""What the connection-slot and memory tests share: a storage node as a real process
(standalone, no ZooKeeper), raw peers from a chosen loopback address (all of
127.0.0.0/8 reaches a daemon listening on 127.0.0.1, so one test machine plays many
peer addresses), and a daemon's memory and sockets as /proc shows them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import struct
import sys
import uuid
from pathlib import Path

from waltz_client.runtime.tls import TlsFiles
from waltz_client.tools.local.processes import DaemonProcess
from waltz_client.wire.client_messages import SERVER_PROTOCOL_VERSIONS, HighWaterMarkRequest
from waltz_client.wire.framing import HANDSHAKE_BYTES, HandshakeStatus, Hello, HelloReply, Service
from waltz_client.wire.records import ReqId
from waltz_client.wire.storage_messages import OpenRequest

MiB = 1024 * 1024


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of ``pid``, in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) * 1024
    return out


def open_sockets(pid: int) -> int:
    """How many sockets ``pid`` holds open."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
    return count


def start_storage(
    tmp_path: Path, *args: str, tls: TlsFiles | None = None
) -> tuple[DaemonProcess, uuid.UUID]:
    """A standalone storage node holding partition 0 of 1, on 127.0.0.1 (stop() it)."""
    key = uuid.uuid4()
    ready = str(tmp_path / "storage.ready")
    tls_args = (
        ["--tls-cert", str(tls.cert), "--tls-key", str(tls.key), "--tls-ca", str(tls.ca)]
        if tls is not None
        else []
    )
    node = DaemonProcess(
        "storage",
        [
            *(sys.executable, "-m", "waltz_storage.main"),
            *("--directory", str(tmp_path / "data"), "--cluster-key", str(key)),
            *("--num-partitions", "1", "--partitions", "0", "--host", "127.0.0.1"),
            *("--port", "0", "--http-port", "0", "--ready-file", ready),
            *tls_args,
            *args,
        ],
        ready,
        str(tmp_path / "storage.log"),
    )
    node.start()
    return node, key


async def connect_from(
    address: str, port: int, tls: ssl.SSLContext | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TCP connection to 127.0.0.1:``port`` from ``address`` (127.x.y.z); over TLS
    with ``tls``."""
    return await asyncio.open_connection("127.0.0.1", port, local_addr=(address, 0), ssl=tls)


async def hello(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, service: Service
) -> bool:
    """Send the hello; whether it was answered OK (False: refused, closed)."""
    if service == Service.STORAGE:
        writer.write(Hello(Service.STORAGE, 1, 1).encode())
    else:
        low, high = min(SERVER_PROTOCOL_VERSIONS), max(SERVER_PROTOCOL_VERSIONS)
        writer.write(Hello(Service.SERVER, low, high).encode())
    try:
        async with asyncio.timeout(10):
            reply = HelloReply.decode(await reader.readexactly(HANDSHAKE_BYTES))
    except (ConnectionError, asyncio.IncompleteReadError):
        return False
    return reply.status == HandshakeStatus.OK


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readexactly(4)
    return await reader.readexactly(struct.unpack(">I", head)[0])


async def opened_storage_peer(
    address: str, port: int, key: uuid.UUID, tls: ssl.SSLContext | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    """A storage connection from ``address`` that has done its hello and a successful
    Open (a peer that read the cluster key from ZooKeeper); None if refused."""
    reader, writer = await connect_from(address, port, tls)
    if not await hello(reader, writer, Service.STORAGE):
        writer.close()
        return None
    writer.write(OpenRequest(-1, 0, -1, key, 1).encode())
    try:
        async with asyncio.timeout(10):
            await read_frame(reader)
    except (ConnectionError, asyncio.IncompleteReadError):
        writer.close()
        return None
    return reader, writer


async def ready_server_peer(
    address: str, port: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    """A client connection from ``address`` past its hello and a first request (a
    High-water Mark request, answered); None if refused."""
    reader, writer = await connect_from(address, port)
    if not await hello(reader, writer, Service.SERVER):
        writer.close()
        return None
    writer.write(HighWaterMarkRequest(ReqId(1, 0, 0, 1)).encode())
    try:
        async with asyncio.timeout(10):
            await read_frame(reader)
    except (ConnectionError, asyncio.IncompleteReadError):
        writer.close()
        return None
    return reader, writer


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    """Whether the daemon closes the connection within ``seconds`` (reading on)."""
    try:
        async with asyncio.timeout(seconds):
            while await reader.read(65536):
                pass
    except TimeoutError:
        return False
    except ConnectionError:
        pass
    return True
