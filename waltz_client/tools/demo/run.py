"""``waltz demo``: a local cluster, a bank on it, faults in the middle, and a report.

Starts an embedded ZooKeeper, three storage nodes and two servers, then runs
bank clients (each with its own sqlite database, or a PostgreSQL schema with
``--database``, or all sharing one with ``--shared-database``; applied exactly
once through the DB-API callbacks) moving money with write locks. Midway it SIGKILLs a
storage node and the owner of a partition, and brings both back. At the end
it checks what a person would want checked: every database identical, no
balance negative, the total conserved, every replica holding the same bytes
for the committed prefix, and prints the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import time
from dataclasses import dataclass, field

from waltz_client.client import SubmitStatus, WaltzClient
from waltz_client.cluster.errors import ClusterError
from waltz_client.config import WaltzClientConfig
from waltz_client.dbapi import ApplyStats, DatabaseCallbacks
from waltz_client.runtime import event_loop
from waltz_client.tools.local.cli import add_security_flags
from waltz_client.tools.local.cluster import LocalCluster, LocalClusterError
from waltz_client.tools.local.processes import ProcessFailed
from waltz_client.tools.local.verify import converged_digests
from waltz_client.tools.local.zookeeper import ZooKeeperUnavailable

from . import bank
from .common import FAST_FAILOVER, check_at_least_one, fresh_cluster


def register(groups: argparse._SubParsersAction) -> None:
    p = groups.add_parser(
        "demo", help="run a bank on a local cluster through storage and server failures"
    )
    p.add_argument("--data-dir", default=".waltz-local/demo", help="wiped and reused")
    p.add_argument("--clients", type=int, default=3, help="bank clients (default 3)")
    p.add_argument("--tellers", type=int, default=4, help="concurrent tellers per client")
    p.add_argument("--transfers", type=int, default=3000, help="in total (default 3000)")
    p.add_argument("--partitions", type=int, default=4, help="partitions (default 4)")
    p.add_argument("--accounts", type=int, default=40, help="accounts (default 40)")
    p.add_argument("--no-faults", action="store_true", help="skip the kills")
    add_security_flags(p)
    p.add_argument(
        "--database",
        metavar="URL",
        help="keep the banks in PostgreSQL (postgresql://user@host:port/dbname), a schema "
        "waltz_demo_<client> each (dropped and made anew); default: a sqlite file each",
    )
    p.add_argument(
        "--shared-database",
        action="store_true",
        help="every client applies the log into one bank (schema waltz_demo_shared, or one "
        "sqlite file), each transaction exactly once in all",
    )
    p.set_defaults(func=cmd_demo)


@dataclass
class Tally:
    submitted: int = 0
    committed: int = 0
    ignored: int = 0
    failed: int = 0
    attempts: int = 0
    lock_failures: int = 0
    latencies: list[float] = field(default_factory=list)


class _CountingTransfer(bank.Transfer):
    lock_failures = 0

    def on_lock_failure(self, transaction_id: int) -> None:
        self.lock_failures += 1


def say(message: str) -> None:
    print(f"[waltz demo] {message}", flush=True)


INITIAL_BALANCE = 1000  # of every account


async def run_bank(args: argparse.Namespace, cluster: LocalCluster) -> int:
    """The bank workload and its checks on a started cluster; 0 when every check passes."""
    paths = bank_databases(args, cluster.data_dir)
    for path in dict.fromkeys(paths):  # a shared bank once
        path.create(args.accounts, INITIAL_BALANCE, fresh=True)
    deadlocks_before = _deadlocks(args.database)
    callbacks = [path.callbacks() for path in paths]
    clients = await _start_clients(cluster, callbacks)
    workload = _Workload(args, cluster)
    elapsed = await workload.run(clients, paths)
    say("all transfers submitted; waiting for every client to apply the whole log")
    hwms = await _wait_until_applied(clients, args.partitions)
    applied = [{p: c.applied_high_water_mark(p) for p in hwms} for c in clients]
    await _close(clients, callbacks, paths)
    # A restarted storage node catches up in its next store session.
    outcome = _Outcome(
        tally=workload.tally,
        elapsed=elapsed,
        hwms=hwms,
        applied=applied,
        digests=await converged_digests(cluster, hwms),
        balances=[path.balances() for path in paths],
        rows=[path.applied() for path in paths],
        stats=[cb.stats for cb in callbacks],
        deadlocks=_deadlocks(args.database) - deadlocks_before,
    )
    checks = _checks(args, outcome)
    _print_report(args, cluster, paths, outcome, checks)
    return 0 if all(checks.values()) else 1


async def _start_clients(
    cluster: LocalCluster, callbacks: list[DatabaseCallbacks]
) -> list[WaltzClient]:
    """A started client per bank's callbacks, each connected to the cluster."""
    config = WaltzClientConfig(
        cluster.zookeeper_connect,
        zk_root=cluster.layout.root,
        max_retries=1000,
        transaction_timeout=None,  # keep trying through any outage it measures
        tls=cluster.client_tls,
        zk_tls=cluster.client_zk_tls,
    )
    clients = [WaltzClient(config, cb) for cb in callbacks]
    for c in clients:
        await c.start()
    return clients


class _Workload:
    """The tellers' transfers, a progress line every second and, midway, the faults."""

    def __init__(self, args: argparse.Namespace, cluster: LocalCluster) -> None:
        self.args = args
        self.cluster = cluster
        self.tally = Tally()
        self.per_teller = max(1, args.transfers // (args.clients * args.tellers))
        self.total = self.per_teller * args.clients * args.tellers
        self.started = time.perf_counter()

    async def run(self, clients: list[WaltzClient], paths: list[bank.BankDb]) -> float:
        """Every teller's transfers, until the last is decided; the seconds they took."""
        self.started = time.perf_counter()
        done = asyncio.Event()
        reporter = asyncio.create_task(self._progress(done))
        fault_task = asyncio.create_task(self._faults())
        await asyncio.gather(
            *(
                self._teller(c, path, 100 * i + k)
                for i, (c, path) in enumerate(zip(clients, paths, strict=True))
                for k in range(self.args.tellers)
            )
        )
        elapsed = time.perf_counter() - self.started
        await fault_task
        done.set()
        await reporter
        return elapsed

    async def _teller(self, c: WaltzClient, path: bank.BankDb, seed: int) -> None:
        args, tally = self.args, self.tally
        rng = random.Random(seed)
        for _ in range(self.per_teller):
            source = rng.randrange(args.accounts)
            targets = [
                a
                for a in range(source % args.partitions, args.accounts, args.partitions)
                if a != source
            ]
            ctx = _CountingTransfer(
                path, source, rng.choice(targets), rng.randint(1, 200), args.partitions
            )
            t0 = time.perf_counter()
            tally.submitted += 1
            result = await c.submit(ctx)
            tally.attempts += result.attempts
            tally.lock_failures += ctx.lock_failures
            if result.status == SubmitStatus.COMMITTED:
                tally.committed += 1
                tally.latencies.append(time.perf_counter() - t0)
            elif result.status == SubmitStatus.IGNORED:
                tally.ignored += 1
            else:
                tally.failed += 1

    async def _progress(self, done: asyncio.Event) -> None:
        tally = self.tally
        while not done.is_set():
            await asyncio.sleep(1.0)
            elapsed = time.perf_counter() - self.started
            say(
                f"{tally.submitted}/{self.total} transfers: {tally.committed} committed, "
                f"{tally.ignored} refused (insufficient funds), {tally.lock_failures} lock "
                f"rejections retried, {tally.committed / elapsed:.0f} tx/s"
            )

    async def _faults(self) -> None:
        if self.args.no_faults:
            return
        await self._committed(0.25)
        await self._kill_a_storage_node()
        await self._committed(0.5)
        await self._kill_the_owner_of_partition_0()

    async def _committed(self, share: float) -> None:
        """Until this share of all transfers has committed."""
        while self.tally.committed < self.total * share:
            await asyncio.sleep(0.1)

    async def _kill_a_storage_node(self) -> None:
        victim = self.cluster.storages[1]
        say(f"SIGKILL {victim.name} (a minority of the replicas)")
        victim.kill()
        await asyncio.sleep(3)
        await asyncio.to_thread(victim.start)
        say(f"{victim.name} restarted; it catches up in the next store session")

    async def _kill_the_owner_of_partition_0(self) -> None:
        cluster = self.cluster
        index, generation = await asyncio.to_thread(cluster.owner_index, 0)
        owner = cluster.servers[index]
        say(f"SIGKILL {owner.name}, owner of partition 0 (generation {generation})")
        owner.kill()
        new_index, new_generation = await asyncio.to_thread(
            cluster.owner_index, 0, owner.name, 60.0
        )
        say(f"partition 0 moved to {cluster.servers[new_index].name} (generation {new_generation})")
        await asyncio.to_thread(owner.start)
        say(f"{owner.name} restarted")


async def _wait_until_applied(clients: list[WaltzClient], partitions: int) -> dict[int, int]:
    """Each partition's high-water mark, once every client has applied up to it (or a
    minute has gone by for that client and partition)."""
    hwms = {}
    for p in range(partitions):
        hwms[p] = await clients[0].high_water_mark(p)
        for c in clients:
            deadline = time.monotonic() + 60
            while c.applied_high_water_mark(p) < hwms[p] and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
    return hwms


async def _close(
    clients: list[WaltzClient], callbacks: list[DatabaseCallbacks], paths: list[bank.BankDb]
) -> None:
    for c in clients:
        await c.close()
    for cb in callbacks:
        cb.close()
    for path in paths:
        path.close()


@dataclass
class _Outcome:
    """What the run left behind, for the checks and the report."""

    tally: Tally
    elapsed: float
    hwms: dict[int, int]
    applied: list[dict[int, int]]
    digests: dict[int, list[str]]
    balances: list[dict[int, int]]
    rows: list[list[tuple[int, int]]]
    stats: list[ApplyStats]
    deadlocks: int


def _checks(args: argparse.Namespace, o: _Outcome) -> dict[str, bool]:
    """What a person would want checked, by name: True if it holds."""
    log_length = sum(h + 1 for h in o.hwms.values())
    balances = o.balances
    return {
        "every client applied the whole log": all(a == o.hwms for a in o.applied),
        "each transaction applied exactly once": all(
            len(r) == len(set(r)) == log_length for r in o.rows
        ),
        "every database identical": all(b == balances[0] for b in balances),
        "no balance negative": all(v >= 0 for v in balances[0].values()),
        "total conserved": sum(balances[0].values()) == args.accounts * INITIAL_BALANCE,
        "committed transfers == log length": o.tally.committed == log_length,
        "replicas identical": all(
            len(set(d)) == 1 and "incomplete" not in d for d in o.digests.values()
        ),
    }


def _print_report(
    args: argparse.Namespace,
    cluster: LocalCluster,
    paths: list[bank.BankDb],
    o: _Outcome,
    checks: dict[str, bool],
) -> None:
    tally, stats, hwms = o.tally, o.stats, o.hwms
    lat = sorted(tally.latencies)
    p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1000 if lat else float("nan")
    print()
    print("=== waltz demo report ===")
    secure = cluster.client_tls is not None and cluster.zk_credential is not None
    print(f"security                  {'mutual TLS, ZooKeeper ACLs' if secure else 'PLAIN TEXT'}")
    print(f"transfers submitted       {tally.submitted}")
    print(f"committed                 {tally.committed} ({tally.committed / o.elapsed:.0f} tx/s)")
    print(f"refused (no funds)        {tally.ignored}")
    print(f"failed                    {tally.failed}")
    print(f"lock rejections retried   {tally.lock_failures}")
    print(f"retries (all causes)      {tally.attempts - tally.submitted}")
    banks = list(dict.fromkeys(paths))
    print(f"banks                     {len(banks)}: {', '.join(map(repr, banks))}")
    print(
        f"applications              {sum(s.applied for s in stats)} committed, "
        f"{sum(s.already_applied for s in stats)} found applied by another client, "
        f"{sum(s.rolled_back for s in stats)} rolled back, {sum(s.retried for s in stats)} "
        f"run again (serialization or deadlock)"
        + (f", {o.deadlocks} deadlocks" if args.database else "")
    )
    print(
        f"commit latency p50/p99    {lat[len(lat) // 2] * 1000:.1f} / {p99:.1f} ms"
        if lat
        else "commit latency            n/a"
    )
    for p in sorted(hwms):
        print(f"partition {p} high-water mark {hwms[p]}; replica SHA-256 {o.digests.get(p)}")
    print(
        f"total balance             {sum(o.balances[0].values())} "
        f"(expected {args.accounts * INITIAL_BALANCE})"
    )
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")


def bank_databases(args: argparse.Namespace, data_dir: str) -> list[bank.BankDb]:
    """Each client's bank: its own (a sqlite file or a PostgreSQL schema), or one shared."""
    if args.database:
        if args.shared_database:
            return [bank.BankDb(args.database, "waltz_demo_shared")] * args.clients
        return [bank.BankDb(args.database, f"waltz_demo_{i}") for i in range(args.clients)]
    if args.shared_database:
        return [bank.BankDb(os.path.join(data_dir, "bank-shared.db"))] * args.clients
    return [bank.BankDb(os.path.join(data_dir, f"bank-{i}.db")) for i in range(args.clients)]


def _deadlocks(database: str | None) -> int:
    """PostgreSQL's count of deadlocks in the demo's database (0 without one)."""
    if not database:
        return 0
    import psycopg

    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
    return int(row[0])


def check_database(url: str) -> str | None:
    """Why the demo cannot use the PostgreSQL database at ``url`` (None if it can)."""
    if not bank.is_postgres_url(url):
        return f"--database must be a postgresql:// URL, got {url!r}"
    try:
        import psycopg
    except ImportError:
        return "--database needs psycopg: pip install 'waltz[postgres]'"
    try:
        psycopg.connect(url, connect_timeout=10).close()
    except psycopg.Error as e:
        return f"cannot connect to --database: {str(e).strip().splitlines()[0]}"
    return None


def cmd_demo(args: argparse.Namespace) -> int:
    if not check_at_least_one("waltz demo", args, "clients", "tellers", "transfers", "partitions"):
        return 2
    if args.accounts < 2 * args.partitions:
        print("waltz demo: error: --accounts must be at least twice --partitions")
        return 2
    if args.database:
        problem = check_database(args.database)
        if problem:
            print(f"waltz demo: error: {problem}")
            return 2
    try:
        cluster = fresh_cluster(
            args.data_dir, args.partitions, 2, FAST_FAILOVER, tls=not args.insecure
        )
        security = (
            "PLAIN TEXT, open ZooKeeper ACL (--insecure)"
            if args.insecure
            else f"mutual TLS (a throw-away CA in {cluster.data_dir}/pki), ZooKeeper ACLs"
        )
        say(f"starting a local cluster in {cluster.data_dir}: {security}")
        cluster.start(say)
    except (LocalClusterError, ZooKeeperUnavailable, ProcessFailed, ClusterError) as e:
        print(f"waltz demo: error: {e}")
        return 2
    try:
        return event_loop.run(run_bank(args, cluster))
    finally:
        say("stopping the cluster")
        cluster.stop()
