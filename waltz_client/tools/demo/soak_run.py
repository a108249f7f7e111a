"""The run of ``waltz soak``, its asyncio shell: a fresh local cluster with retention on,
the producer (open loop) and the consumers (``soak_consumers``) against it, and a sample
(``soak_sampling``) every ``--sample-every`` seconds, printed as a table row as it is
taken. ``run_soak`` returns the run's document; the verdict is the command's (``soak``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TextIO

from kazoo.client import KazooClient

from waltz_client.client import SubmitStatus, WaltzClient, WaltzError
from waltz_client.cluster import admin
from waltz_client.cluster.retention import RetentionRule
from waltz_client.cluster.zk import close
from waltz_client.config import WaltzClientConfig
from waltz_client.runtime import event_loop
from waltz_client.runtime.tasks import wait_for
from waltz_client.tools.local.cluster import LocalCluster

from .common import Put, open_loop
from .soak_consumers import BelowLogStart, Consumer, make_consumers, start_consumer
from .soak_report import Table, fmt_elapsed
from .soak_sampling import MB, Disk, cluster_processes, cluster_state, machine, mb, rss_bytes

Say = Callable[[str], None]
Processes = list[tuple[str, Callable[[], int | None]]]


def run_soak(args: argparse.Namespace, duration: float, out: TextIO, say: Say) -> dict[str, Any]:
    """Start a fresh local cluster, keep ``--retention-bytes`` of each partition, load and
    sample it for ``duration`` seconds, stop it. The document of the run, without a
    verdict."""
    cluster = _fresh_cluster(args)
    say(
        f"starting a local cluster in {cluster.data_dir}: ZooKeeper, 3 storage nodes "
        f"({args.segment_bytes / 2**20:g} MiB segments), {args.servers} server(s), "
        f"{args.partitions} partitions x 3 replicas, "
        + ("plain text" if args.insecure else "mutual TLS")
    )
    cluster.start()
    logging.getLogger("waltz_client.client").addFilter(BelowLogStart())
    try:
        zk = cluster.zk_connect()
        try:
            _keep_retention(args, cluster, zk, say)
            return event_loop.run(_load_and_sample(args, cluster, zk, duration, out, say))
        finally:
            close(zk)
    finally:
        cluster.stop()


def _fresh_cluster(args: argparse.Namespace) -> LocalCluster:
    """Three storage nodes with small segments (retention deletes some every few
    seconds), the servers stepping retention every ``--retention-interval``."""
    shutil.rmtree(args.data_dir, ignore_errors=True)
    return LocalCluster(
        args.data_dir,
        storages=3,
        partitions=args.partitions,
        replicas=3,
        servers=args.servers,
        storage_args=["--segment-bytes", str(args.segment_bytes), *args.storage_arg],
        server_args=[
            "--retention-interval",
            str(args.retention_interval),
            *args.server_arg,
        ],
        tls=not args.insecure,
    )


def _keep_retention(
    args: argparse.Namespace, cluster: LocalCluster, zk: KazooClient, say: Say
) -> None:
    admin.update_retention(
        zk,
        cluster.layout.root,
        lambda policy: policy.with_rule([None], RetentionRule(max_bytes=args.retention_bytes)),
    )
    say(
        f"retention: keep {args.retention_bytes / 2**20:g} MiB per partition per "
        f"replica, applied every {args.retention_interval:g} s"
    )


@dataclass
class Load:
    committed: int = 0
    failed: int = 0


@dataclass
class _Clients:
    """The producer's client; the consumers, with their clients and the tasks that read
    for them until ``stop``."""

    producer: WaltzClient
    consumers: list[Consumer]
    stop: asyncio.Event
    clients: list[WaltzClient]
    tasks: list[asyncio.Task[None]]


async def _load_and_sample(
    args: argparse.Namespace,
    cluster: LocalCluster,
    zk: KazooClient,
    duration: float,
    out: TextIO,
    say: Say,
) -> dict[str, Any]:
    running = await _start_clients(args, cluster)
    load = Load()
    submit = _producer(running.producer, args.partitions, args.size, load)
    procs = cluster_processes(cluster)
    names = [n for n, _ in procs]
    _announce(args, running.consumers, duration, say)
    sampler = _Sampler(args, cluster, zk, running, load, procs, _sample_table(out, names))
    started = time.monotonic()
    producing = asyncio.create_task(open_loop(args.rate, max(1, int(args.rate * duration)), submit))
    try:
        await sampler.sample_until(started, duration, args.sample_every)
    finally:
        await _stop_clients(running, producing, say)
    return {
        "settings": _settings(args),
        "machine": machine(),
        "processes": names,
        "pids": {n: pid() for n, pid in procs},
        "samples": sampler.samples,
        "final": {"committed": load.committed, "failed": load.failed},
    }


async def _start_clients(args: argparse.Namespace, cluster: LocalCluster) -> _Clients:
    def config(feed: bool) -> WaltzClientConfig:
        return WaltzClientConfig(
            cluster.zookeeper_connect,
            zk_root=cluster.layout.root,
            feed=feed,
            max_retries=1000,
            transaction_timeout=None,  # keep trying through any outage it measures
            tls=cluster.client_tls,
            zk_tls=cluster.client_zk_tls,
        )

    stop = asyncio.Event()
    producer = await WaltzClient(config(False)).start()
    consumers = make_consumers(
        args.live_consumers, args.slow_consumers, args.consumer_rate, args.partitions
    )
    clients: list[WaltzClient] = [producer]
    tasks: list[asyncio.Task[None]] = []
    for c in consumers:
        client, task = await start_consumer(c, config, stop)
        tasks.append(task)
        clients.append(client)
    return _Clients(producer, consumers, stop, clients, tasks)


def _producer(
    producer: WaltzClient, partitions: int, size: int, load: Load
) -> Callable[[int], Awaitable[None]]:
    """The ``i``-th transaction of the load, on partition ``i`` modulo ``partitions``."""
    payload = os.urandom(size)

    async def one(i: int) -> None:
        try:
            r = await producer.submit(Put(i % partitions, payload))
        except WaltzError:
            load.failed += 1
            return
        if r.status == SubmitStatus.COMMITTED:
            load.committed += 1
        else:
            load.failed += 1

    return one


async def _stop_clients(running: _Clients, producing: asyncio.Task[None], say: Say) -> None:
    running.stop.set()
    try:
        await wait_for(producing, 30)
    except TimeoutError:
        say("the producer's last submissions did not finish within 30 s")
    for t in running.tasks:
        t.cancel()
    await asyncio.gather(*running.tasks, return_exceptions=True)
    for c in running.clients:
        await c.close()


def _announce(
    args: argparse.Namespace, consumers: list[Consumer], duration: float, say: Say
) -> None:
    slow = [c for c in consumers if c.rate > 0]
    live = [c for c in consumers if c.rate <= 0]
    say(
        f"load: {args.rate:g} tx/s of {args.size} bytes for {args.minutes:g} min "
        f"({fmt_elapsed(duration)}); {len(slow)} slow consumer(s) at "
        f"{args.consumer_rate:g} tx/s each "
        f"({', '.join(c.kind for c in slow) or 'none'}), {len(live)} live; "
        f"RSS sampled every {args.sample_every:g} s; warm-up "
        f"{fmt_elapsed(duration * args.warm_up)}"
    )


def _sample_table(out: TextIO, names: list[str]) -> Table:
    print(file=out)
    print("RSS (MB) of every process over time, and the load", file=out)
    return Table(
        out,
        [
            "elapsed",
            *names,
            "commits tx/s",
            "live behind",
            "slow behind",
            "slow skipped",
            "log start (min)",
            "disk MB",
            "server caches MB",
        ],
    )


class _Sampler:
    """Samples of the run, each recorded and printed as a row of ``table``."""

    def __init__(
        self,
        args: argparse.Namespace,
        cluster: LocalCluster,
        zk: KazooClient,
        running: _Clients,
        load: Load,
        procs: Processes,
        table: Table,
    ) -> None:
        self.partitions = args.partitions
        self.cluster = cluster
        self.zk = zk
        self.producer = running.producer
        self.consumers = running.consumers
        self.slow = [c for c in running.consumers if c.rate > 0]
        self.live = [c for c in running.consumers if c.rate <= 0]
        self.load = load
        self.procs = procs
        self.names = [n for n, _ in procs]
        self.table = table
        self.samples: list[dict[str, Any]] = []

    async def sample_until(self, started: float, duration: float, every: float) -> None:
        """A sample now, then every ``every`` seconds from ``started``, the last at
        ``duration``."""
        await self.sample(0.0)
        k = 1
        while True:
            at = min(duration, k * every)
            await asyncio.sleep(max(0.0, started + at - time.monotonic()))
            await self.sample(time.monotonic() - started)
            if at >= duration:
                break
            k += 1

    async def sample(self, elapsed: float) -> None:
        rss = {n: mb(rss_bytes(pid())) for n, pid in self.procs}
        hwms = await self._high_water_marks()
        starts, disk, caches = await asyncio.to_thread(
            cluster_state, self.zk, self.cluster, self.partitions
        )
        previous = self.samples[-1] if self.samples else None
        span = elapsed - previous["elapsed"] if previous else 0
        rate = (self.load.committed - previous["committed"]) / span if previous and span else None
        self.samples.append(self._record(elapsed, rss, caches, rate, hwms, starts, disk))
        self.table.row(
            [
                fmt_elapsed(elapsed),
                *[rss[n] for n in self.names],
                None if rate is None else round(rate),
                sum(c.behind(hwms) for c in self.live) if self.live else None,
                sum(c.behind(hwms) for c in self.slow) if self.slow else None,
                sum(c.skipped for c in self.slow) if self.slow else None,
                min(starts.values()) if starts else None,
                round(sum(sum(d[0]) for d in disk.values()) / MB, 1),
                None if None in caches.values() else round(sum(caches.values()), 1),
            ]
        )

    async def _high_water_marks(self) -> dict[int, int]:
        """Each partition's, as the producer's client learns it (none if it does not)."""
        hwms: dict[int, int] = {}
        for p in range(self.partitions):
            with contextlib.suppress(WaltzError, TimeoutError):
                hwms[p] = await wait_for(self.producer.high_water_mark(p), 10)
        return hwms

    def _record(
        self,
        elapsed: float,
        rss: dict[str, float | None],
        caches: dict[str, float | None],
        rate: float | None,
        hwms: dict[int, int],
        starts: dict[int, int],
        disk: dict[int, Disk],
    ) -> dict[str, Any]:
        return {
            "elapsed": round(elapsed, 1),
            "rss_mb": rss,
            "cache_mb": caches,
            "committed": self.load.committed,
            "failed": self.load.failed,
            "tx_per_s": None if rate is None else round(rate, 1),
            "partitions": [
                {
                    "partition": p,
                    "high_water_mark": hwms.get(p),
                    "log_start": starts.get(p),
                    "disk_bytes": disk[p][0],
                    "segments": disk[p][1],
                }
                for p in range(self.partitions)
            ],
            "consumers": [
                {
                    "name": c.name,
                    "kind": c.kind,
                    "rate": c.rate,
                    "consumed": c.consumed,
                    "data_bytes": c.data_bytes,
                    "behind": c.behind(hwms),
                    "skips": c.skips,
                    "skipped": c.skipped,
                    "errors": c.errors,
                }
                for c in self.consumers
            ],
        }


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "minutes": args.minutes,
        "partitions": args.partitions,
        "servers": args.servers,
        "rate": args.rate,
        "size": args.size,
        "retention_bytes": args.retention_bytes,
        "segment_bytes": args.segment_bytes,
        "retention_interval": args.retention_interval,
        "slow_consumers": args.slow_consumers,
        "consumer_rate": args.consumer_rate,
        "live_consumers": args.live_consumers,
        "sample_every": args.sample_every,
        "warm_up": args.warm_up,
        "max_growth_mb": args.max_growth_mb,
        "max_growth_pct": args.max_growth_pct,
        "storage_args": args.storage_arg,
        "server_args": args.server_arg,
        "tls": not args.insecure,
    }
