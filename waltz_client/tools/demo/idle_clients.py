"""``waltz bench --scale idle-clients``: what mounted clients that do nothing cost the server.

What "a client" is here: one connection to the server (mutual TLS with the local
cluster's client certificate, or plain text with ``--insecure``) that gets its own client
ID from the server (AllocateClientId, as a ``WaltzClient`` gets one) and mounts every
partition of the cluster with its feed open (a Mount at high-water mark -1 each, on an
empty log). That is the server's share of a ``WaltzClient``'s stream connection. A
``WaltzClient`` also keeps a ZooKeeper session and, once it reads, an RPC connection a
server: both are left out, since 10,000 ``WaltzClient`` objects would be 10,000 ZooKeeper
sessions. The clients speak the protocol directly (``ServerConnection``, the client
library's own connection), held by up to 4 load processes (one for each 2,500 clients),
at most 16 of each dialling at once.

A cell: a fresh cluster (3 storage nodes, ONE server, the partitions given) whose
server's connection, feed and client-ID limits are raised to fit the clients; a few
clients mounted and closed (the server's code paths warmed); a second of rest, then the
server's RSS (VmRSS in /proc) and its CPU over an idle period with no client (the
baseline); the clients mounted; a second of rest; the server's RSS and CPU over the same
idle period with every client mounted, and its RSS again. A client's bytes: (RSS after
the idle period - RSS before the clients) / clients. A client's CPU: (CPU over the idle
period with them - baseline) / clients, a second. The load processes count the messages
that reach a client after its mounts: an idle feed sends none.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import queue
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from waltz_client.runtime import event_loop, file_limit
from waltz_client.runtime.process_cpu import process_cpu_seconds
from waltz_client.runtime.tasks import wait_for
from waltz_client.tools.local.cluster import HOST, LocalCluster
from waltz_client.wire.client_messages import (
    AllocateClientIdRequest,
    ClientIdAllocated,
    ClientMessage,
    ErrorResponse,
    MountRequest,
    MountResponse,
    MountStatus,
)
from waltz_client.wire.records import ReqId
from waltz_client.wire.server_connection import ServerConnection

from .common import fresh_cluster
from .scale_settings import ScaleArgumentError, record

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess
    from multiprocessing.queues import Queue
    from multiprocessing.synchronize import Event

    from waltz_client.runtime.tls import TlsFiles

    from .scale_settings import ScaleSettings

A_CLIENT = (
    "a client = one connection to the server with its own client ID (AllocateClientId), "
    "mounted on every partition with its feed open; no ZooKeeper session, no RPC connection"
)
CLIENTS_A_PROCESS = 2500
MAX_LOAD_PROCESSES = 4
DIALLING = 16  # connections a load process has in their handshake or mounts at once
WARM_UP = 8  # clients mounted and closed before the baseline
MARGIN = 64  # connections, feeds, client IDs and files beyond the clients'
REST = 1.0  # seconds before each reading
ANSWER_TIMEOUT = 120.0  # a handshake, an allocation or a mount on a loaded machine

# What a load process puts on its queue: ("mounted", clients, first errors, errors) once
# every client is mounted, then ("done", connections still open, messages after mounts).
Report = tuple[Any, ...]


@dataclass
class IdleCell:
    """One run of the idle-clients measurement."""

    clients: int
    partitions: int  # each client mounts all of them
    tls: bool
    idle_seconds: float
    load_processes: int
    mount_seconds: float  # from the first dial to the last client mounted
    rss_before: int  # the server's RSS, bytes, without the clients
    rss_mounted: int  # a second after the last mount
    rss_after: int  # at the end of the idle period with them
    cpu_baseline_s: float  # the server's CPU over the idle period without clients
    cpu_idle_s: float  # ... and with them
    still_open: int  # of the clients' connections at the end
    messages_while_idle: int  # that reached the clients after their mounts
    run: int = 0

    @property
    def bytes_per_client(self) -> float:
        return (self.rss_after - self.rss_before) / self.clients

    @property
    def cpu_us_per_client_second(self) -> float:
        """The CPU the clients added, a client, a second of idleness (may be below 0:
        the baseline's own noise)."""
        extra = self.cpu_idle_s - self.cpu_baseline_s
        return 1e6 * extra / self.clients / self.idle_seconds


def parse_vm_rss(status: str) -> int:
    """The resident set size in bytes from the text of ``/proc/<pid>/status``."""
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            value, unit = line.split()[1:3]
            if unit.lower() != "kb":
                raise ValueError(f"VmRSS in {unit!r}, expected kB")
            return int(value) * 1024
    raise ValueError("no VmRSS line (a kernel thread, or a process that has exited)")


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return parse_vm_rss(f.read())


def load_processes_for(clients: int) -> int:
    return max(1, min(MAX_LOAD_PROCESSES, math.ceil(clients / CLIENTS_A_PROCESS)))


def shares(clients: int, processes: int) -> list[int]:
    """``clients`` split over ``processes`` as evenly as can be."""
    each, extra = divmod(clients, processes)
    return [each + (1 if i < extra else 0) for i in range(processes)]


def server_args(clients: int) -> list[str]:
    """The server's limits raised to fit ``clients`` on one address (127.0.0.1), each
    mounted on every partition, all with client IDs of one certificate."""
    limit = str(clients + MARGIN)
    return [
        "--max-connections", limit,
        "--max-connections-per-address", limit,
        "--max-feeds-per-partition", limit,
        "--client-id-quota", limit,
    ]  # fmt: skip


# --- a client --------------------------------------------------------------------------


class IdleClient:
    """One connection, one client ID, a mount on each partition; then nothing."""

    __slots__ = ("answers", "conn", "late", "mounted")

    def __init__(self) -> None:
        self.answers: dict[tuple[int, int], asyncio.Future[ClientMessage]] = {}
        self.conn: ServerConnection | None = None
        self.late = 0  # messages after the mounts
        self.mounted = False

    def _on_message(self, m: ClientMessage) -> None:
        if isinstance(m, MountResponse | ClientIdAllocated | ErrorResponse):
            answer = self.answers.pop((m.req_id.partition_id, m.req_id.seq), None)
            if answer is not None and not answer.done():
                answer.set_result(m)
                return
        if self.mounted:
            self.late += 1

    async def _ask(self, q: ReqId, message: ClientMessage) -> ClientMessage:
        assert self.conn is not None
        answer = asyncio.get_running_loop().create_future()
        self.answers[(q.partition_id, q.seq)] = answer
        self.conn.send(message)
        return await wait_for(answer, ANSWER_TIMEOUT)

    @classmethod
    async def open(
        cls, port: int, opener: Callable[..., Any], generations: dict[int, int]
    ) -> IdleClient:
        client = cls()
        conn = client.conn = await ServerConnection.connect(
            HOST, port, on_message=client._on_message, open_connection=opener, timeout=60
        )
        try:
            q = ReqId(-1, 0, 0, 0)  # only the sequence number matters
            got = await client._ask(q, AllocateClientIdRequest(q))
            if not isinstance(got, ClientIdAllocated):
                raise RuntimeError(f"no client ID: {got}")
            mounts = [ReqId(got.client_id, g, p, 1) for p, g in generations.items()]
            answers = await asyncio.gather(
                *(client._ask(m, MountRequest(m, -1, 1)) for m in mounts)
            )
            for answer in answers:
                if not isinstance(answer, MountResponse) or answer.status != MountStatus.READY:
                    raise RuntimeError(f"a mount answered {answer}")
        except BaseException:
            await conn.close()
            raise
        client.mounted = True
        return client

    @property
    def open_now(self) -> bool:
        return self.conn is not None and not self.conn.closed

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()


def _opener(tls: TlsFiles | None) -> Callable[..., Any]:
    if tls is None:
        return asyncio.open_connection
    from waltz_client.runtime.tls import TlsContexts, tls_open_connection

    return tls_open_connection(TlsContexts(tls, listening=False))


async def open_clients(
    count: int, port: int, tls: TlsFiles | None, generations: dict[int, int]
) -> tuple[list[IdleClient], list[str]]:
    """``count`` clients, at most ``DIALLING`` being made at once, each tried 3 times:
    (those mounted, what failed)."""
    opener = _opener(tls)
    gate = asyncio.Semaphore(DIALLING)
    clients: list[IdleClient] = []

    async def one() -> None:
        async with gate:
            for attempt in range(3):
                try:
                    clients.append(await IdleClient.open(port, opener, generations))
                    return
                except (OSError, TimeoutError):
                    if attempt == 2:
                        raise
                    await asyncio.sleep(1.0)

    results = await asyncio.gather(*(one() for _ in range(count)), return_exceptions=True)
    errors = [f"{type(e).__name__}: {e}" for e in results if isinstance(e, BaseException)]
    return clients, errors


def _hold(
    port: int,
    tls: TlsFiles | None,
    generations: dict[int, int],
    count: int,
    out: Queue[Report],
    release: Event,
) -> None:
    """A load process: mount ``count`` clients, say so, hold them until ``release``."""
    file_limit.raise_open_files_limit()

    async def main() -> None:
        clients, errors = await open_clients(count, port, tls, generations)
        out.put(("mounted", len(clients), errors[:3], len(errors)))
        await asyncio.to_thread(release.wait, 24 * 3600)
        still_open = sum(c.open_now for c in clients)
        late = sum(c.late for c in clients)
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
        out.put(("done", still_open, late))

    event_loop.run(main())


def _collect(out: Queue[Report], procs: Sequence[BaseProcess], timeout: float) -> list[Report]:
    """One report from each load process; RuntimeError if one dies or is late."""
    deadline = time.monotonic() + timeout
    reports: list[Report] = []
    while len(reports) < len(procs):
        try:
            reports.append(out.get(timeout=1.0))
        except queue.Empty:
            dead = [p for p in procs if not p.is_alive() and p.exitcode != 0]
            if dead:
                raise RuntimeError(
                    f"a load process exited with status {dead[0].exitcode}"
                ) from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"the load processes did not report in {timeout:g} s") from None
    return reports


# --- a cell ----------------------------------------------------------------------------


def _generations(cluster: LocalCluster, partitions: int, timeout: float = 120.0) -> dict[int, int]:
    """Each partition's generation, once server-0 owns them all."""
    deadline = time.monotonic() + timeout
    while True:
        owned = cluster.ownership()
        if all(owned.get(p, (None, 0))[0] == "server-0" for p in range(partitions)):
            return {p: owned[p][1] for p in range(partitions)}
        if time.monotonic() > deadline:
            raise RuntimeError(f"server-0 does not own all {partitions} partitions")
        time.sleep(0.2)


async def _warm_up(count: int, port: int, tls: TlsFiles | None, gens: dict[int, int]) -> None:
    clients, errors = await open_clients(count, port, tls, gens)
    for c in clients:
        await c.close()
    if errors:
        raise RuntimeError(f"warming up, {len(errors)} client(s) failed: {errors[0]}")


def check_open_files(clients: int) -> None:
    """ScaleArgumentError unless the open-files hard limit (which the server and the
    load processes raise their soft limits to) fits the server's connections."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = clients + 4 * MARGIN
    if hard != resource.RLIM_INFINITY and hard < need:
        raise ScaleArgumentError(
            f"{clients} idle clients need about {need} open files in the server; the hard "
            f"limit here is {hard} (ulimit -Hn): raise it, or measure fewer --scale-clients"
        )


def measure_cell(s: ScaleSettings, clients: int, partitions: int) -> IdleCell:
    cluster = fresh_cluster(s.data_dir, partitions, 1, server_args(clients), tls=s.tls)
    cluster.start()
    try:
        server = cluster.servers[0]
        pid, port = server.ready["pid"], server.ready["port"]
        gens = _generations(cluster, partitions)
        tls = cluster.client_tls
        event_loop.run(_warm_up(min(clients, WARM_UP), port, tls, gens))
        time.sleep(REST)
        rss_before = rss_bytes(pid)
        cpu = process_cpu_seconds(pid)
        time.sleep(s.seconds)
        baseline = process_cpu_seconds(pid) - cpu
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        release = ctx.Event()
        counts = shares(clients, load_processes_for(clients))
        procs = [ctx.Process(target=_hold, args=(port, tls, gens, n, out, release)) for n in counts]
        started = time.monotonic()
        for proc in procs:
            proc.start()
        try:
            mounted = _collect(out, procs, 120 + clients * 0.1)
            mount_seconds = time.monotonic() - started
            errors = [e for r in mounted for e in r[2]]
            failed = sum(r[3] for r in mounted)
            if failed:
                raise RuntimeError(f"{failed} of {clients} clients failed to mount: {errors[0]}")
            time.sleep(REST)
            rss_mounted = rss_bytes(pid)
            cpu = process_cpu_seconds(pid)
            time.sleep(s.seconds)
            idle = process_cpu_seconds(pid) - cpu
            rss_after = rss_bytes(pid)
            release.set()
            done = _collect(out, procs, 120)
        finally:
            release.set()
            for proc in procs:
                proc.join(30)
                if proc.is_alive():
                    proc.kill()
        return IdleCell(
            clients,
            partitions,
            s.tls,
            s.seconds,
            len(procs),
            mount_seconds,
            rss_before,
            rss_mounted,
            rss_after,
            baseline,
            idle,
            sum(r[1] for r in done),
            sum(r[2] for r in done),
        )
    finally:
        cluster.stop()


# --- the table -------------------------------------------------------------------------


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f}"


def median_cell(cells: list[IdleCell]) -> IdleCell:
    """The run with the median bytes a client (the upper one of an even count)."""
    ordered = sorted(cells, key=lambda c: c.bytes_per_client)
    return ordered[len(ordered) // 2]


def describe(cell: IdleCell) -> str:
    """A run's line, as the progress shows it."""
    return (
        f"run {cell.run + 1}: {cell.clients:,} clients x {cell.partitions} partition(s) "
        f"({'TLS' if cell.tls else 'plain'}), mounted in {cell.mount_seconds:.1f} s: server "
        f"RSS {_mib(cell.rss_before)} -> {_mib(cell.rss_mounted)} -> "
        f"{_mib(cell.rss_after)} MiB, {cell.bytes_per_client:,.0f} bytes a client; CPU over "
        f"{cell.idle_seconds:g} s idle {cell.cpu_baseline_s:.3f} s without them, "
        f"{cell.cpu_idle_s:.3f} s with them; {cell.still_open:,} still open, "
        f"{cell.messages_while_idle} messages while idle"
    )


def table(cells: list[IdleCell]) -> str:
    head = [
        "clients", "partitions each", "link", "server RSS MiB before / mounted / after idle",
        "bytes a client", "server CPU s over the idle period: none / clients",
        "CPU a client, us a second", "messages while idle",
    ]  # fmt: skip
    rows = [head, ["---:", "---:", "---", "---:", "---:", "---:", "---:", "---:"]]
    for key in dict.fromkeys((c.clients, c.partitions, c.tls) for c in cells):
        cell = median_cell([c for c in cells if (c.clients, c.partitions, c.tls) == key])
        rows.append(
            [
                f"{cell.clients:,}",
                str(cell.partitions),
                "mutual TLS" if cell.tls else "plain",
                f"{_mib(cell.rss_before)} / {_mib(cell.rss_mounted)} / {_mib(cell.rss_after)}",
                f"{cell.bytes_per_client:,.0f}",
                f"{cell.cpu_baseline_s:.3f} / {cell.cpu_idle_s:.3f}",
                f"{cell.cpu_us_per_client_second:.3f}",
                str(cell.messages_while_idle),
            ]
        )
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


def run(s: ScaleSettings, say: Callable[[str], None]) -> list[dict[str, Any]]:
    check_open_files(max(s.clients))
    say(A_CLIENT)
    say(
        f"{','.join(map(str, s.clients))} clients on {','.join(map(str, s.partitions))} "
        f"partition(s), 1 server, {'mutual TLS' if s.tls else 'plain text'}, an idle period "
        f"of {s.seconds:g} s, {s.runs} run(s)"
    )
    cells: list[IdleCell] = []
    for r in range(s.runs):
        for p in s.partitions:
            for n in s.clients:
                cell = measure_cell(s, n, p)
                cell.run = r
                cells.append(cell)
                say(describe(cell))
    say("")
    say(
        f"median of {s.runs} run(s) (by bytes a client); the server's RSS (VmRSS) and CPU; "
        "issue 43's goal: at most 2 KiB and no measurable CPU a client"
    )
    say(table(cells))
    return [
        record(
            c,
            bytes_per_client=c.bytes_per_client,
            cpu_us_per_client_second=c.cpu_us_per_client_second,
        )
        for c in cells
    ]
