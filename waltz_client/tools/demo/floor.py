"""`waltz bench --floor`: what this machine allows one replicated write, with no logic.

The same processes and messages as a waltz write at C=1 (one writer, one write in
flight), and nothing else: a client sends a 1 KiB record to a relay (the server's
place), the relay sends it on to three nodes, each writes it into a file whose blocks
were written and synced ahead (as a segment is) and ``fdatasync``s it, the relay answers
the client once two of the three have answered. Each process is a loop of blocking
socket calls: no event loop, no decoding, no checks, no index, no metrics.

What is left is the platform's share of a write: the loopback hops, waking each process,
the disk's sync. Issue 16 asked a waltz write at C=1 for at most 0.5 ms p50 and 0.3 ms
of the cluster's CPU; this measures how much of both the machine itself takes. A row
without the sync (``fsync off``) separates the hops from the disk.
"""

from __future__ import annotations

import multiprocessing
import os
import platform
import resource
import select
import socket
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from queue import Empty
from typing import TYPE_CHECKING, TypeVar

from .common import WritesMeasured

if TYPE_CHECKING:
    import argparse
    from multiprocessing.process import BaseProcess
    from multiprocessing.queues import Queue

T = TypeVar("T")

# What the floor's processes report: (role, what it measured: CPU seconds, work done
# or latencies).
Report = tuple[str, object]

ROUND = struct.Struct(">Q")  # a message: its round number, then the record
STOP = (1 << 64) - 1  # the round that tells every process to report and exit
NODES = 3
QUORUM = 2
FILE_BYTES = 8 << 20  # written with zeros and synced before the first round


@dataclass
class FloorRow(WritesMeasured):
    """One run of the floor: writes, their latencies, and each role's CPU."""

    fsync: bool
    writes: int
    seconds: float
    latencies_ms: list[float]
    # role -> (user, system) CPU seconds over the run, summed over the role's processes
    cpu: dict[str, tuple[float, float]]
    # each node's (records written, fdatasyncs made): every record reaches every node
    node_work: list[tuple[int, int]]

    def us_per_write(self, role: str, part: int | None = None) -> float:
        """CPU a write of ``role`` in microseconds: user + system, or one of them."""
        user, system = self.cpu[role]
        used = user + system if part is None else (user, system)[part]
        return 1e6 * used / max(1, self.writes)

    @property
    def cluster_us(self) -> float:
        """The relay's and the nodes' CPU a write (a cluster's, as the sweep counts)."""
        return self.us_per_write("relay") + self.us_per_write("nodes")

    @property
    def cluster_kernel_us(self) -> float:
        return self.us_per_write("relay", 1) + self.us_per_write("nodes", 1)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("peer closed")
        got += k
    return bytes(buf)


def _accept(server: socket.socket) -> socket.socket:
    conn, _ = server.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    server.close()
    return conn


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _cpu_now() -> tuple[float, float]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime


def _since(start: tuple[float, float]) -> tuple[float, float]:
    user, system = _cpu_now()
    return user - start[0], system - start[1]


def _node(path: str, size: int, fsync: bool, ports: Queue[int], out: Queue[Report]) -> None:
    """Answer each record once it is written (and synced) into a pre-written file."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        chunk = bytes(1 << 20)
        for offset in range(0, FILE_BYTES, len(chunk)):
            os.pwrite(fd, chunk, offset)
        os.fsync(fd)
        server = socket.create_server(("127.0.0.1", 0))
        ports.put(server.getsockname()[1])
        relay = _accept(server)
        message = ROUND.size + size
        offset = written = synced = 0
        start = None
        while True:
            request = _recv_exactly(relay, message)
            if start is None:
                start = _cpu_now()
            if ROUND.unpack_from(request)[0] == STOP:
                break
            if offset + size > FILE_BYTES:
                offset = 0
            os.pwrite(fd, request[ROUND.size :], offset)
            offset += size
            written += 1
            if fsync:
                os.fdatasync(fd)
                synced += 1
            relay.sendall(request[: ROUND.size])
        relay.close()
        out.put(("nodes", _since(start or _cpu_now())))
        out.put(("node_work", (written, synced)))
    finally:
        os.close(fd)
        os.unlink(path)


def _relay(node_ports: list[int], size: int, port_out: Queue[int], out: Queue[Report]) -> None:
    """Send each record to every node; answer the client once a quorum answered."""
    nodes = [_connect(port) for port in node_ports]
    server = socket.create_server(("127.0.0.1", 0))
    port_out.put(server.getsockname()[1])
    client = _accept(server)
    message = ROUND.size + size
    start = None
    while True:
        request = _recv_exactly(client, message)
        if start is None:
            start = _cpu_now()
        for node in nodes:
            node.sendall(request)
        (number,) = ROUND.unpack_from(request)
        if number == STOP:
            # A node that lagged behind still answers the rounds it had queued: read
            # them until it closes, so that none of its answers meets a closed socket.
            for node in nodes:
                while node.recv(1 << 16):
                    pass
            break
        answered = 0
        while answered < QUORUM:
            ready, _, _ = select.select(nodes, [], [])
            for node in ready:
                # A late answer to an earlier round is read here and not counted.
                if ROUND.unpack(_recv_exactly(node, ROUND.size))[0] == number:
                    answered += 1
        client.sendall(request[: ROUND.size])
    out.put(("relay", _since(start or _cpu_now())))


def _client(port: int, size: int, seconds: float, out: Queue[Report]) -> None:
    """One write in flight for ``seconds``: each waits for its answer."""
    relay = _connect(port)
    payload = os.urandom(size)
    latencies: list[float] = []
    start = _cpu_now()
    stop_at = time.perf_counter() + seconds
    number = 0
    while True:
        t0 = time.perf_counter()
        if t0 >= stop_at:
            break
        number += 1
        relay.sendall(ROUND.pack(number) + payload)
        _recv_exactly(relay, ROUND.size)
        latencies.append((time.perf_counter() - t0) * 1000)
    relay.sendall(ROUND.pack(STOP) + payload)
    out.put(("client", _since(start)))
    out.put(("latencies", latencies))


def _get(queue: Queue[T], processes: Sequence[BaseProcess], timeout: float) -> T:
    """The next item of ``queue``; RuntimeError, naming it, if one of ``processes`` died
    first or nothing came within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return queue.get(timeout=0.5)
        except Empty:
            pass
        for proc in processes:
            if proc.exitcode not in (None, 0):
                raise RuntimeError(f"{proc.name} exited with code {proc.exitcode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no report from the floor's processes within {timeout:g} s")


def measure_floor(data_dir: str, size: int, seconds: float, fsync: bool) -> FloorRow:
    """One run: three node processes, a relay and a client, for ``seconds``."""
    os.makedirs(data_dir, exist_ok=True)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    ports = ctx.Queue()
    processes = [
        ctx.Process(
            target=_node,
            name=f"floor node {i}",
            args=(os.path.join(data_dir, f"node-{i}.dat"), size, fsync, ports, out),
        )
        for i in range(NODES)
    ]
    for proc in processes:
        proc.start()
    try:
        node_ports = [_get(ports, processes, 120) for _ in range(NODES)]
        relay = ctx.Process(target=_relay, name="floor relay", args=(node_ports, size, ports, out))
        relay.start()
        processes.append(relay)
        relay_port = _get(ports, processes, 120)
        client = ctx.Process(
            target=_client, name="floor client", args=(relay_port, size, seconds, out)
        )
        client.start()
        processes.append(client)
        reports: dict[str, list] = {}
        for _ in range(2 * NODES + 3):  # each node's CPU and work, the relay's, the client's
            role, value = _get(out, processes, seconds + 120)
            reports.setdefault(role, []).append(value)
    finally:
        for proc in processes:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()
    latencies = sorted(reports.pop("latencies")[0])
    node_work = reports.pop("node_work")
    cpu = {
        role: (sum(u for u, _ in values), sum(s for _, s in values))
        for role, values in reports.items()
    }
    return FloorRow(fsync, len(latencies), seconds, latencies, cpu, node_work)


def floor_table(rows: list[FloorRow]) -> str:
    """The median run of each kind, as a markdown table."""
    head = [
        "path (C=1, no logic)",
        "writes/s",
        "p50 ms",
        "p99 ms",
        "cluster CPU a write (of it, kernel)",
        "CPU a write: relay, each node, client",
    ]
    lines = [head, ["---"] + ["---:"] * 4 + ["---"]]
    for fsync in (False, True):
        mine = sorted((r for r in rows if r.fsync == fsync), key=lambda r: r.rate)
        if not mine:
            continue
        row = mine[len(mine) // 2]
        lines.append(
            [
                "client, relay, 3 nodes, quorum 2" + (", fdatasync" if fsync else ", fsync off"),
                f"{row.rate:,.0f}",
                f"{row.percentile(0.5):.3f}",
                f"{row.percentile(0.99):.3f}",
                f"{row.cluster_us:.0f} us ({row.cluster_kernel_us:.0f} us)",
                f"{row.us_per_write('relay'):.0f} us, "
                f"{row.us_per_write('nodes') / NODES:.0f} us, {row.us_per_write('client'):.0f} us",
            ]
        )
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def run_floor(
    data_dir: str, size: int, seconds: float, runs: int, say: Callable[[str], None] = print
) -> list[FloorRow]:
    rows = []
    for run in range(runs):
        for fsync in (False, True):
            row = measure_floor(data_dir, size, seconds, fsync)
            rows.append(row)
            say(
                f"run {run + 1}/{runs} {'fdatasync' if fsync else 'fsync off':9s} "
                f"{row.rate:9,.0f} writes/s  p50 {row.percentile(0.5):.3f} ms  "
                f"cluster CPU {row.cluster_us:.0f} us a write "
                f"(kernel {row.cluster_kernel_us:.0f} us)"
            )
    return rows


# Options of the sweep that the floor does not take (it runs at C=1, one system).
NOT_FOR_THE_FLOOR = (
    "compare_concurrency",
    "compare_partitions",
    "no_zookeeper",
    "zookeeper_members",
    "json",
)


def cmd_floor(args: argparse.Namespace) -> int:
    given = [n for n in NOT_FOR_THE_FLOOR if getattr(args, n) != args.sweep_defaults[n]]
    if given:
        flags = ", ".join("--" + n.replace("_", "-") for n in given)
        print(f"waltz bench: error: {flags} only apply with --compare, not --floor")
        return 2
    if args.runs < 1 or args.seconds <= 0 or args.size < 1:
        print("waltz bench: error: --runs and --size must be at least 1, --seconds above 0")
        return 2
    print(
        f"waltz bench --floor: a client, a relay and {NODES} nodes that write and "
        f"fdatasync ({QUORUM} of {NODES} answer), one {args.size}-byte write in flight, "
        f"blocking sockets and no logic; {args.seconds:g} s a row, {args.runs} run(s); "
        f"{os.cpu_count()} CPUs ({platform.machine()})",
        flush=True,
    )
    rows = run_floor(
        os.path.join(args.data_dir, "floor"),
        args.size,
        args.seconds,
        args.runs,
        lambda line: print(line, flush=True),
    )
    print()
    print(f"median of {args.runs} run(s):")
    print(floor_table(rows))
    print(
        "A waltz write at C=1 (`waltz bench --compare --compare-concurrency 1`) takes the "
        "same hops and syncs; what it takes beyond this row is the software's share."
    )
    return 0
