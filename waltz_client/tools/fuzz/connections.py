"""The asyncio shell of ``waltz fuzz``: planned connections sent to one daemon.

``fuzz_target`` sends the plans (``plans``) to a daemon over many concurrent
connections (``run_connection``), discards what comes back, probes that the daemon
still answers a well-formed request (``probe``), and records in ``FuzzStats`` frames/s,
refused and reset connections, whether the process is alive and its RSS (``process``),
stopping early if it exits or stops answering. ``TlsDial`` is how it dials a TLS port.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
import ssl
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from waltz_client.runtime.tasks import wait_for
from waltz_client.runtime.tls import TlsFiles, build_context
from waltz_client.wire.client_messages import HighWaterMarkRequest
from waltz_client.wire.framing import HANDSHAKE_BYTES, MAGIC
from waltz_client.wire.records import ReqId
from waltz_client.wire.storage_messages import LastSessionInfoRequest

from .frames import FuzzTarget, open_request
from .plans import ConnectionPlan, hello_for, plan_connections
from .process import proc_status_kib, process_alive
from .tls import capture_client_hello

CONNECT_TIMEOUT = 5.0
WRITE_TIMEOUT = 10.0  # a daemon applying back pressure may stop reading for a while
PROBE_TIMEOUT = 10.0
PROBE_FAILURES_TO_STOP = 3


@dataclass(frozen=True, slots=True)
class TlsDial:
    """How the fuzzer dials a TLS port: as a peer with a certificate the daemon accepts
    (so frames reach the protocol behind TLS), and as one without a certificate."""

    context: ssl.SSLContext
    anonymous: ssl.SSLContext
    server_hostname: str

    @classmethod
    def of(cls, files: TlsFiles, server_hostname: str) -> TlsDial:
        return cls(
            build_context(files, listening=False),
            build_context(TlsFiles(ca=files.ca), listening=False),
            server_hostname,
        )

    def client_hello(self) -> bytes:
        return capture_client_hello(self.context, self.server_hostname)


@dataclass(frozen=True, slots=True)
class Endpoint:
    name: str
    host: str
    port: int
    pid: int | None = None
    alive: Callable[[], bool] | None = None  # default: /proc/<pid>
    tls: TlsDial | None = None  # the port speaks TLS

    def is_alive(self) -> bool | None:
        if self.alive is not None:
            return self.alive()
        return process_alive(self.pid) if self.pid is not None else None


@dataclass
class FuzzStats:
    name: str
    protocol: str
    address: str
    pid: int | None
    seed: int
    num_partitions: int
    frames: int = 0  # written to the socket (the daemon may have closed it already)
    mutated: int = 0
    unsent: int = 0  # planned, but the connection failed before they were written
    bytes_sent: int = 0
    bytes_received: int = 0
    connections: int = 0
    refused: int = 0  # connect refused or failed
    reset: int = 0  # reset or broken pipe
    write_stalls: int = 0  # the daemon did not take our bytes within WRITE_TIMEOUT
    close_timeouts: int = 0  # the daemon kept the connection open past our EOF
    tls_strangers: int = 0  # mutated ClientHellos (or plain text) sent to a TLS port
    tls_no_cert: int = 0  # TLS connections without a client certificate
    seconds: float = 0.0
    probes: int = 0
    probe_failures: int = 0
    probe_max_seconds: float = 0.0
    answered_after: bool | None = None  # the final probe
    alive_after: bool | None = None
    rss_before_kib: int | None = None
    rss_after_kib: int | None = None
    peak_rss_kib: int | None = None  # VmHWM: the highest since the daemon started
    stopped: str = ""  # why the run stopped early
    suspects: list[tuple[int, int]] = field(default_factory=list)  # (index, seed)
    mutation_counts: collections.Counter[str] = field(default_factory=collections.Counter)

    @property
    def frames_per_s(self) -> float:
        return self.frames / self.seconds if self.seconds > 0 else 0.0

    @property
    def failed(self) -> bool:
        return self.alive_after is False or self.answered_after is False


async def _discard(reader: asyncio.StreamReader, stats: FuzzStats) -> None:
    """Read until the daemon closes; what it says is not checked (it must not crash)."""
    with contextlib.suppress(OSError):
        while True:
            data = await reader.read(256 * 1024)
            if not data:
                return
            stats.bytes_received += len(data)


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (length,) = struct.unpack(">I", await reader.readexactly(4))
    if not 0 < length <= 1024 * 1024:
        raise ConnectionError(f"reply frame length {length}")
    return await reader.readexactly(length)


async def _send(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(data)
    await wait_for(writer.drain(), WRITE_TIMEOUT)


def _dial(host: str, port: int, plan: ConnectionPlan, tls: TlsDial | None) -> Any:
    if tls is None or plan.opening == "tls-stranger":
        return asyncio.open_connection(host, port)
    context = tls.anonymous if plan.opening == "tls-no-cert" else tls.context
    return asyncio.open_connection(host, port, ssl=context, server_hostname=tls.server_hostname)


async def run_connection(
    host: str,
    port: int,
    plan: ConnectionPlan,
    stats: FuzzStats,
    reply_timeout: float,
    tls: TlsDial | None = None,
) -> None:
    """Send one plan; count what happened. Never raises for what the daemon does."""
    try:
        reader, writer = await wait_for(_dial(host, port, plan, tls), CONNECT_TIMEOUT)
    except (OSError, TimeoutError, ssl.SSLError):  # ssl.SSLError: the handshake refused
        stats.refused += 1
        stats.unsent += len(plan.frames)
        return
    stats.connections += 1
    stats.tls_strangers += plan.opening == "tls-stranger"
    stats.tls_no_cert += plan.opening == "tls-no-cert"
    sink: asyncio.Task[None] | None = None
    sent = False
    try:
        rest = plan.stream
        if plan.await_replies:
            await _send(writer, plan.hello)
            await wait_for(reader.readexactly(HANDSHAKE_BYTES), PROBE_TIMEOUT)
            if plan.open_frame:
                await _send(writer, plan.open_frame)
                await wait_for(_read_frame(reader), PROBE_TIMEOUT)
            rest = b"".join(plan.frames)
        sink = asyncio.ensure_future(_discard(reader, stats))
        if plan.fragment:  # the hello and the first frame's head a few bytes at a time
            head, rest = rest[:48], rest[48:]
            for i in range(0, len(head), 3):
                await _send(writer, head[i : i + 3])
                await asyncio.sleep(0)
        await _send(writer, rest)
        sent = True
        if plan.ending == "eof":
            writer.write_eof()
            try:
                await wait_for(asyncio.shield(sink), reply_timeout)
            except TimeoutError:
                stats.close_timeouts += 1
        elif plan.ending == "linger":
            await asyncio.wait({sink}, timeout=reply_timeout)
        elif plan.ending == "close":
            writer.close()  # a FIN without waiting for anything
    except TimeoutError:
        stats.write_stalls += 1
    except (OSError, asyncio.IncompleteReadError):
        stats.reset += 1
    except RuntimeError:  # uvloop: a write on a transport the daemon's reset closed
        stats.reset += 1
    finally:
        if sink is not None:
            sink.cancel()
        if not writer.is_closing():
            writer.transport.abort()  # a reset: no close handshake to wait for
    if sent:
        stats.frames += len(plan.frames)
        stats.mutated += sum(1 for m in plan.mutations if m)
        stats.bytes_sent += len(plan.stream)
        stats.mutation_counts.update(m for m in plan.mutations if m)
        if plan.tls_mutation:
            stats.mutation_counts[f"tls {plan.tls_mutation}"] += 1
    else:
        stats.unsent += len(plan.frames)


async def probe(
    host: str,
    port: int,
    t: FuzzTarget,
    timeout: float = PROBE_TIMEOUT,
    tls: TlsDial | None = None,
) -> float:
    """Seconds a well-formed request takes to be answered (any answer); raises if none.
    Storage: Open, then a partition request (answered by the partition's worker thread);
    server: a high-water mark request (answered by the partition or as not owned)."""
    started = time.perf_counter()

    async def exchange() -> None:
        if tls is None:
            reader, writer = await asyncio.open_connection(host, port)
        else:
            reader, writer = await asyncio.open_connection(
                host, port, ssl=tls.context, server_hostname=tls.server_hostname
            )
        try:
            writer.write(hello_for(t))
            reply = await reader.readexactly(HANDSHAKE_BYTES)
            if reply[:4] != MAGIC or reply[4] != 0:
                raise ConnectionError(f"handshake refused: {reply!r}")
            if t.protocol == "storage":
                writer.write(open_request(random.Random(0), t).data)
                await _read_frame(reader)
                writer.write(LastSessionInfoRequest(-1, 2, 0).encode())
            else:
                writer.write(HighWaterMarkRequest(ReqId(0, -1, 0, 1)).encode())
            await _read_frame(reader)
        finally:
            writer.transport.abort()

    await wait_for(exchange(), timeout)
    return time.perf_counter() - started


async def fuzz_target(
    endpoint: Endpoint,
    target: FuzzTarget,
    *,
    seed: int,
    frames: int,
    concurrency: int = 16,
    reply_timeout: float = 0.5,
    probe_interval: float = 1.0,
    progress: Callable[[FuzzStats], None] | None = None,
) -> FuzzStats:
    """Send ``frames`` planned frames to ``endpoint`` over ``concurrency`` connections at a
    time; stop early if the daemon exits or stops answering probes."""
    host, port = endpoint.host, endpoint.port
    stats = FuzzStats(
        endpoint.name, target.protocol, f"{host}:{port}", endpoint.pid, seed, target.num_partitions
    )
    if endpoint.pid is not None:
        stats.rss_before_kib = proc_status_kib(endpoint.pid)
    plans = plan_connections(target, seed, frames)
    in_flight: dict[int, int] = {}
    recent: collections.deque[tuple[int, int]] = collections.deque(maxlen=16)
    done = asyncio.Event()

    def stop(reason: str) -> None:
        if not stats.stopped:
            stats.stopped = reason
            # The connections that may have done it: those under way, and the last few.
            stats.suspects = sorted(in_flight.items()) + list(recent)
        done.set()

    async def worker() -> None:
        for plan in plans:
            if done.is_set():
                return
            in_flight[plan.index] = plan.seed
            try:
                await run_connection(host, port, plan, stats, reply_timeout, endpoint.tls)
            finally:
                del in_flight[plan.index]
                recent.append((plan.index, plan.seed))

    async def watch() -> None:
        failures = 0
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                await wait_for(done.wait(), probe_interval)
            if done.is_set():
                return
            if endpoint.is_alive() is False:
                stop("the daemon exited")
                return
            stats.probes += 1
            try:
                seconds = await probe(host, port, target, tls=endpoint.tls)
                stats.probe_max_seconds = max(stats.probe_max_seconds, seconds)
                failures = 0
            except (OSError, TimeoutError, asyncio.IncompleteReadError, ConnectionError):
                stats.probe_failures += 1
                failures += 1
                if endpoint.is_alive() is False:
                    stop("the daemon exited")
                elif failures >= PROBE_FAILURES_TO_STOP:
                    stop(f"no answer to {failures} probes in a row (a hang?)")
            if progress is not None:
                progress(stats)

    started = time.perf_counter()
    watcher = asyncio.ensure_future(watch())
    await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    stats.seconds = time.perf_counter() - started
    done.set()
    await watcher
    if endpoint.is_alive() is False:
        stop("the daemon exited")
    stats.alive_after = endpoint.is_alive()
    if stats.alive_after is not False:
        try:
            await probe(host, port, target, tls=endpoint.tls)
            stats.answered_after = True
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            stats.answered_after = False
    if endpoint.pid is not None:
        stats.rss_after_kib = proc_status_kib(endpoint.pid)
        stats.peak_rss_kib = proc_status_kib(endpoint.pid, "VmHWM")
    return stats
