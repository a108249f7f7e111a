"""The daemon-wide budget for partly received frames holds in a real process's memory,
and the memory goes back after the connections close (issue 39, row 6).

The issue measured 16 partial 63 MiB frames growing a server by 511 MB and a storage
node by 723 MB against a budget of 256 MiB. Here, with the budget set to 64 MiB and
frames to 32 MiB (the same shape, a quarter of the bytes), peers send partial frames a
megabyte at a time, round robin, until they can send no more: the daemon's peak RSS
(VmHWM, reset before the attack, so it covers the close too) must grow by at most the
budget plus ``SLACK``, and come back once they have gone. Three things broke it: when
every partial frame was stopped, the oldest read on until complete on top of the
budget (it now finishes in room kept free below the budget); a closed connection's
partial frame stayed until the cyclic collector found the connection, so the frames
read after the peers closed piled up and stayed (now dropped in ``connection_lost``);
and over TLS the records joined per read left the heap fragmented (now decrypted into
one buffer, ``waltz_client.runtime.listener``). On a server, a connection that has not sent a
first request may hold no more than 64 KiB of a frame.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Awaitable, Callable

import pytest
from attack_helpers import (
    MiB,
    closed_within,
    connect_from,
    hello,
    opened_storage_peer,
    proc_status,
    ready_server_peer,
    start_storage,
)

from waltz_client.runtime.tls import TlsContexts
from waltz_client.tools.local.certs import local_pki
from waltz_client.wire.framing import Service

pytestmark = pytest.mark.timeout(240)

BUDGET = 64 * MiB
FRAME = 32 * MiB
LIMITS = ["--partial-frames-max-bytes", "64MiB", "--max-frame-bytes", "32MiB"]
# Over the budget at the peak: a socket read (256 KiB) per connection stopped past it,
# with TLS up to 512 KiB more of undecrypted input in the TLS layer, and the process's
# own churn. Measured at the peak: +57 to +63 MiB with the fix (+65 to +67 MiB over
# TLS); without it +81 to +95 MiB (+104 to +160 MiB over TLS), and after the close +168
# MiB on a server, held for good.
SLACK = 12 * MiB
# What may stay above the baseline once the peers have gone (test_memory_return's).
MARGIN = 28 * MiB

Peer = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def reset_peak(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS


async def flood(peers: list[Peer], message_type: int) -> None:
    """Each peer announces a frame of FRAME - 1 MiB and sends all but its last MiB, a
    MiB at a time and round robin, until none of them can send more for a second."""
    piece = bytes(MiB)
    sent = [0] * len(peers)

    async def send(i: int, writer) -> None:
        writer.write(struct.pack(">IB", FRAME - MiB, message_type))
        for _ in range(FRAME // MiB - 2):
            writer.write(piece)
            await writer.drain()  # waits while the daemon does not read this peer
            sent[i] += 1
            await asyncio.sleep(0)  # the others' turn

    tasks = [asyncio.ensure_future(send(i, w)) for i, (_, w) in enumerate(peers)]
    last, still = -1, time.monotonic()
    while time.monotonic() - still < 1.0 and not all(t.done() for t in tasks):
        await asyncio.sleep(0.1)
        if sum(sent) != last:
            last, still = sum(sent), time.monotonic()
    await asyncio.sleep(0.5)  # the daemon reads what the kernel holds
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def held_then_returned(
    pid: int, connect: Callable[[], Awaitable[list[Peer]]], message_type: int
) -> tuple[int, int]:
    """(peak growth, during the flood and while the daemon reads what the peers sent
    before they closed; growth left once they have gone, 30 s at most after the close)."""
    await asyncio.sleep(1.5)  # the trim after start-up connections has run
    peers = await connect()
    await asyncio.sleep(0.5)
    base = proc_status(pid)["VmRSS"]
    reset_peak(pid)
    await flood(peers, message_type)
    for _, writer in peers:
        writer.close()
    await asyncio.sleep(1.0)
    deadline = time.monotonic() + 30
    left = proc_status(pid)["VmRSS"] - base
    while left > MARGIN and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        left = proc_status(pid)["VmRSS"] - base
    return proc_status(pid)["VmHWM"] - base, left


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_partial_frames_on_a_storage_node_stay_within_the_budget(tmp_path, tls):
    """12 opened connections (peers that know the cluster key, or have a server's
    certificate), partial Appends."""
    files = None
    if tls:
        hosts = ["127.0.0.1", "localhost"]
        pki = local_pki(str(tmp_path / "pki"), {"waltz-storage-0": hosts, "waltz-server-0": hosts})
        files = pki["waltz-storage-0"]
        context = TlsContexts(pki["waltz-server-0"], listening=False).current()
    node, key = start_storage(tmp_path, *LIMITS, tls=files)
    assert node.pid is not None
    port = node.ready["port"]

    async def connect() -> list[Peer]:
        dial = context if tls else None
        peers = [await opened_storage_peer("127.0.0.2", port, key, dial) for _ in range(12)]
        assert all(peers)
        return peers  # type: ignore[return-value]

    try:
        peak, left = asyncio.run(held_then_returned(node.pid, connect, 6))
    finally:
        node.stop()
    assert peak <= BUDGET + SLACK, f"+{peak / MiB:.0f} MiB at the peak (budget 64 MiB)"
    assert left <= MARGIN, f"+{left / MiB:.0f} MiB left 30 s after the close"


def test_partial_frames_on_a_server_stay_within_the_budget(make_cluster):
    """Before its first request a connection may hold 64 KiB of a frame: 16 that start
    a 31 MiB frame after their hello are closed at once. Then 12 connections past a
    first request send partial Appends."""
    cluster = make_cluster(partitions=1, storages=1, server_args=LIMITS)
    server = cluster.servers[0]
    pid, port = server.pid, server.ready["port"]
    assert pid is not None

    async def strangers() -> tuple[int, int]:
        await asyncio.sleep(1.5)
        base = proc_status(pid)["VmRSS"]
        reset_peak(pid)
        peers = []
        for _ in range(16):
            reader, writer = await connect_from("127.0.0.3", port)
            assert await hello(reader, writer, Service.SERVER)
            writer.write(struct.pack(">IB", FRAME - MiB, 2) + bytes(4 * MiB))
            peers.append((reader, writer))
        closed = 0
        for reader, writer in peers:
            closed += await closed_within(reader, 10)
            writer.close()
        return closed, proc_status(pid)["VmHWM"] - base

    async def connect() -> list[Peer]:
        peers = [await ready_server_peer("127.0.0.2", port) for _ in range(12)]
        assert all(peers)
        return peers  # type: ignore[return-value]

    closed, grown = asyncio.run(strangers())
    assert closed == 16
    assert grown <= SLACK, f"+{grown / MiB:.0f} MiB for frames before a first request"
    peak, left = asyncio.run(held_then_returned(pid, connect, 2))
    assert peak <= BUDGET + SLACK, f"+{peak / MiB:.0f} MiB at the peak (budget 64 MiB)"
    assert left <= MARGIN, f"+{left / MiB:.0f} MiB left 30 s after the close"
