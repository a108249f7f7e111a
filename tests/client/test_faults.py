"""The client under faults, against a real cluster: a client process SIGKILLed and
restarted resumes from its stored high-water mark and applies nothing twice; the owning
server SIGKILLed mid-stream loses nothing and the feed stays gap-free."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from waltz_client import SubmitStatus, WaltzClient, WaltzClientConfig
from waltz_client.tools.demo import bank

pytestmark = pytest.mark.timeout(300)

ACCOUNTS = 6
INITIAL = 1000

WORKER = textwrap.dedent(
    """
    import asyncio, random, sys
    from waltz_client import WaltzClient, WaltzClientConfig
    from waltz_client.tools.demo import bank

    zookeeper, root, path, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

    async def main():
        config = WaltzClientConfig(zookeeper, zk_root=root, max_retries=1000)
        async with WaltzClient(config, bank.bank_callbacks(path)) as client:
            rng = random.Random(seed)
            while True:
                source = rng.randrange({accounts})
                target = (source + 2) % {accounts}
                await client.submit(bank.Transfer(path, source, target, rng.randint(1, 20), 2))

    asyncio.run(main())
    """
).format(accounts=ACCOUNTS)


def replay(records_by_partition: dict[int, list]) -> dict[int, int]:
    """Balances from the log itself, independent of any client's database."""
    balances = dict.fromkeys(range(ACCOUNTS), INITIAL)
    for records in records_by_partition.values():
        for r in records:
            t = json.loads(r.data)
            balances[t["from"]] -= t["amount"]
            balances[t["to"]] += t["amount"]
    return balances


async def read_log(cluster, partitions: int) -> dict[int, list]:
    config = WaltzClientConfig(cluster.zookeeper_connect, zk_root=cluster.layout.root, feed=False)
    async with WaltzClient(config) as reader:
        return {p: [r async for r in reader.read(p)] for p in range(partitions)}


def wait_applied(path: str, at_least: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while len(bank.applied(path)) < at_least:
        assert time.monotonic() < deadline, f"only {len(bank.applied(path))} applied"
        time.sleep(0.1)


def test_a_killed_client_resumes_from_its_stored_high_water_mark(make_cluster, tmp_path):
    cluster = make_cluster(partitions=2)
    path = str(tmp_path / "bank.db")
    bank.open_bank(path, ACCOUNTS, INITIAL)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    args = [sys.executable, str(script), cluster.zookeeper_connect, cluster.layout.root, path]

    log = open(tmp_path / "worker.log", "ab")  # noqa: SIM115
    first = subprocess.Popen([*args, "1"], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_applied(path, 40)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        after_kill = len(bank.applied(path))
        second = subprocess.Popen([*args, "2"], stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_applied(path, after_kill + 40)
        finally:
            second.send_signal(signal.SIGTERM)
            second.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
        log.close()

    log_records = asyncio.run(read_log(cluster, 2))
    rows = bank.applied(path)
    assert len(rows) == len(set(rows))
    # The database holds exactly the log's transactions, each once, and their effects.
    for p in (0, 1):
        mine = sorted(t for q, t in rows if q == p)
        assert mine == list(range(len(mine)))
        assert len(mine) <= len(log_records[p])
    applied_prefix = {p: log_records[p][: len([1 for q, _ in rows if q == p])] for p in (0, 1)}
    assert bank.balances(path) == replay(applied_prefix)


def test_the_owner_killed_mid_stream_loses_nothing(make_cluster, tmp_path):
    cluster = make_cluster(partitions=2, servers=2)
    paths = [str(tmp_path / f"bank-{i}.db") for i in range(2)]
    for path in paths:
        bank.open_bank(path, ACCOUNTS, INITIAL)

    async def scenario() -> tuple[list, list[WaltzClient]]:
        config = WaltzClientConfig(
            cluster.zookeeper_connect, zk_root=cluster.layout.root, max_retries=1000
        )
        clients = [WaltzClient(config, bank.bank_callbacks(path)) for path in paths]
        for c in clients:
            await c.start()
        results: list = []
        killed = asyncio.Event()

        async def teller(c: WaltzClient, path: str, first: int) -> None:
            for i in range(40):
                source = (first + i) % ACCOUNTS
                ctx = bank.Transfer(path, source, (source + 2) % ACCOUNTS, 5, 2)
                results.append(await c.submit(ctx))
                if len(results) == 30 and not killed.is_set():
                    killed.set()
                    owner, _ = cluster.owner_index(0)
                    cluster.servers[owner].kill()

        await asyncio.gather(
            *(teller(c, path, k) for c, path in zip(clients, paths, strict=True) for k in (0, 1))
        )
        for p in (0, 1):
            hwm = await clients[0].high_water_mark(p)
            for c in clients:
                for _ in range(600):
                    if c.applied_high_water_mark(p) >= hwm:
                        break
                    await asyncio.sleep(0.05)
        for c in clients:
            await c.close()
        return results, clients

    results, _ = asyncio.run(scenario())
    assert [r.status for r in results] == [SubmitStatus.COMMITTED] * len(results)
    log_records = asyncio.run(read_log(cluster, 2))
    assert sum(len(v) for v in log_records.values()) == len(results)
    committed_ids = sorted(r.transaction_id for r in results)
    assert len(committed_ids) == len(results)
    for path in paths:
        rows = bank.applied(path)
        assert len(rows) == len(set(rows)) == len(results)
        assert bank.balances(path) == replay(log_records)


if os.name != "posix":  # pragma: no cover
    pytest.skip("signals are POSIX", allow_module_level=True)
