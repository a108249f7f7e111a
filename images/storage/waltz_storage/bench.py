"""``waltz storage bench``: one storage node's append rate and latency, beside the raw disk.

Starts a real ``waltz-storage`` process on a fresh directory, then for each
batch size appends 1 KiB records for a fixed time, first with one Append
in flight (closed loop), then with several pipelined (as a server does), and
measures the raw rate of the same disk: the same bytes per write, each write
fsync'd, from this process. With ``partitions`` > 1, as many appenders run at once,
one a partition, as a server's partitions do: the node's group commit across
partitions (one syncfs) is what that measures.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass

from waltz_client.runtime import event_loop
from waltz_client.runtime.process_cpu import process_cpu_seconds
from waltz_client.wire.framing import FRAME_HEADER
from waltz_client.wire.native import describe as describe_loops
from waltz_client.wire.records import DEFAULT_FORMAT, Record, RecordBatch, ReqId
from waltz_client.wire.storage_client import StorageClient
from waltz_client.wire.storage_messages import MESSAGE_HEADER, StorageMessageType

from .segment_format import disk_overhead

_TXID = struct.Struct(">q")


@dataclass
class Result:
    batch: int
    inflight: int
    records_per_s: float
    mb_per_s: float
    p50_ms: float
    p99_ms: float
    raw_records_per_s: float
    # The storage process's CPU (all threads, user and system) a record appended: what a
    # CPU-bound node spends, beside the rate the disk allows.
    node_cpu_us_per_record: float = 0.0

    @property
    def ratio(self) -> float:
        return self.records_per_s / self.raw_records_per_s if self.raw_records_per_s else 0.0


class StorageDidNotStart(RuntimeError):
    """The bench's storage process exited or never became ready (its stderr says why)."""


def start_storage_process(
    directory: str,
    key: uuid.UUID,
    num_partitions: int = 1,
    extra: list[str] | None = None,
    timeout: float = 30.0,
) -> tuple[subprocess.Popen, dict]:
    """A real storage process on free ports; returns it and its ready-file contents."""
    ready = os.path.join(directory, "ready.json")
    cmd = [
        sys.executable,
        "-m",
        "waltz_storage.main",
        "--directory",
        os.path.join(directory, "data"),
        "--cluster-key",
        str(key),
        "--num-partitions",
        str(num_partitions),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--http-port",
        "0",
        "--ready-file",
        ready,
        "--log-level",
        "WARNING",
        *(extra or []),
    ]
    proc = subprocess.Popen(cmd)
    deadline = time.monotonic() + timeout
    while not os.path.exists(ready):
        if proc.poll() is not None:
            raise StorageDidNotStart(
                f"the storage process exited with status {proc.returncode} before it was ready"
            )
        if time.monotonic() > deadline:
            proc.kill()
            raise StorageDidNotStart(f"the storage process was not ready within {timeout:g} s")
        time.sleep(0.02)
    with open(ready) as f:
        return proc, json.load(f)


class AppendFrames:
    """Pre-built Append frames: only the sequence number and transaction IDs change. The
    records are in this build's format (with a commit time), the node's own version's."""

    def __init__(self, batch: int, record_bytes: int, partition: int, session: int) -> None:
        data = os.urandom(record_bytes)
        now = int(time.time() * 1000)
        template = RecordBatch.from_records(
            [Record(i, ReqId(1, 1, partition, i), 0, data, now) for i in range(batch)],
            DEFAULT_FORMAT,
        )
        self._head = bytearray(FRAME_HEADER.size + MESSAGE_HEADER.size + 4)
        body_len = MESSAGE_HEADER.size + 4 + len(template.buf)
        FRAME_HEADER.pack_into(self._head, 0, body_len + 1, StorageMessageType.APPEND_REQUEST)
        self._records = bytearray(template.buf)
        self._positions = [pos for _, pos, _ in template.spans]
        self._partition = partition
        self._session = session
        self._batch = batch
        struct.pack_into(">i", self._head, FRAME_HEADER.size + MESSAGE_HEADER.size, batch)

    def frame(self, seq: int, first_txid: int) -> bytes:
        MESSAGE_HEADER.pack_into(self._head, FRAME_HEADER.size, self._session, seq, self._partition)
        records = self._records
        for k, pos in enumerate(self._positions):
            _TXID.pack_into(records, pos, first_txid + k)
        return bytes(self._head) + bytes(records)


@dataclass(frozen=True)
class AppendLoad:
    """What each appender sends: ``batch`` records of ``record_bytes`` an Append,
    ``inflight`` Appends outstanding, for ``duration`` seconds, in store session
    ``session``, to the node at ``host:port`` of the cluster ``key``."""

    host: str
    port: int
    key: uuid.UUID
    batch: int
    record_bytes: int
    inflight: int
    duration: float
    session: int = 1


async def _append_runs(load: AppendLoad, partitions: int) -> tuple[int, list[float], float]:
    """``_append_run`` on each of ``partitions`` partitions at once; the records of all,
    every latency, and the longest run's seconds."""
    runs = await asyncio.gather(*(_append_run(load, p, partitions) for p in range(partitions)))
    return (
        sum(records for records, _, _ in runs),
        [x for _, latencies, _ in runs for x in latencies],
        max(elapsed for _, _, elapsed in runs),
    )


async def _append_run(
    load: AppendLoad, partition: int = 0, num_partitions: int = 1
) -> tuple[int, list[float], float]:
    batch = load.batch
    client = await StorageClient.connect(load.host, load.port)
    try:
        if not client.speaks_commit_time:  # the frames are pre-built in record format 2
            raise RuntimeError(f"the node chose protocol version {client.version}, too old")
        await client.open(load.key, num_partitions)
        next_txid = await client.max_transaction_id(load.session, partition) + 1
        frames = AppendFrames(batch, load.record_bytes, partition, load.session)
        latencies: list[float] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + load.duration
        window: asyncio.Queue = asyncio.Queue()
        sent = 0

        def send() -> None:
            nonlocal next_txid, sent
            seq = client.next_seq()
            future = client.submit_frame(seq, frames.frame(seq, next_txid))
            window.put_nowait((time.perf_counter(), future))
            next_txid += batch
            sent += 1

        started_at = time.perf_counter()
        for _ in range(load.inflight):
            send()
        acked = 0
        while acked < sent:
            started, future = await window.get()
            response = await future
            if response.TYPE != StorageMessageType.SUCCESS_RESPONSE:
                raise RuntimeError(f"append failed: {response}")
            latencies.append(time.perf_counter() - started)
            acked += 1
            if loop.time() < deadline:
                send()
        return acked * batch, latencies, time.perf_counter() - started_at
    finally:
        await client.close()


def raw_disk_rate(directory: str, batch: int, record_bytes: int, duration: float) -> float:
    """Records/s when each batch's on-disk bytes are written and fsync'd, one batch at a time."""
    path = os.path.join(directory, "raw-disk-test")
    chunk = os.urandom(batch * (record_bytes + disk_overhead(DEFAULT_FORMAT)))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        writes = 0
        started = time.perf_counter()
        while time.perf_counter() - started < duration:
            os.write(fd, chunk)
            os.fsync(fd)
            writes += 1
        elapsed = time.perf_counter() - started
    finally:
        os.close(fd)
        os.unlink(path)
    return writes * batch / elapsed


def run_bench(
    directory: str | None,
    batches: list[int],
    record_bytes: int,
    duration: float,
    inflights: list[int],
    progress: Callable[[str], None] = print,
    *,
    partitions: int = 1,
    group_sync: bool = True,
) -> list[Result]:
    base = directory or tempfile.mkdtemp(prefix="waltz-bench-", dir=".")
    os.makedirs(base, exist_ok=True)
    work = tempfile.mkdtemp(prefix="run-", dir=base)
    key = uuid.uuid4()
    extra = [] if group_sync else ["--group-sync", "false"]
    proc, ready = start_storage_process(work, key, partitions, extra)
    results = []
    try:
        for batch in batches:
            raw = raw_disk_rate(work, batch, record_bytes, duration)
            for inflight in inflights:
                load = AppendLoad(
                    "127.0.0.1", ready["port"], key, batch, record_bytes, inflight, duration
                )
                cpu_before = process_cpu_seconds(proc.pid)
                records, latencies, elapsed = event_loop.run(_append_runs(load, partitions))
                node_cpu = process_cpu_seconds(proc.pid) - cpu_before
                rate = records / elapsed
                lat_ms = sorted(x * 1000 for x in latencies)
                result = Result(
                    batch,
                    inflight,
                    rate,
                    rate * record_bytes / 1e6,
                    statistics.median(lat_ms),
                    lat_ms[int(0.99 * (len(lat_ms) - 1))],
                    raw,
                    node_cpu * 1e6 / max(records, 1),
                )
                results.append(result)
                progress(format_row(result))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
        if directory is None:
            shutil.rmtree(base, ignore_errors=True)
    return results


HEADER = (
    f"{'batch':>6} {'in flight':>9} {'records/s':>11} {'MB/s':>8} {'p50 ms':>8} "
    f"{'p99 ms':>8} {'raw disk rec/s':>15} {'vs raw':>7} {'node CPU us/rec':>16}"
)


def format_row(r: Result) -> str:
    return (
        f"{r.batch:>6} {r.inflight:>9} {r.records_per_s:>11,.0f} {r.mb_per_s:>8.1f} "
        f"{r.p50_ms:>8.2f} {r.p99_ms:>8.2f} {r.raw_records_per_s:>15,.0f} {r.ratio:>6.2f}x "
        f"{r.node_cpu_us_per_record:>16.1f}"
    )


def machine_summary() -> str:
    return (
        f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, per-record loops {describe_loops()}"
    )


def results_json(results: list[Result]) -> str:
    return json.dumps([asdict(r) | {"ratio": r.ratio} for r in results], indent=2)
