"""A client's figures on a real cluster: how far its feed is behind (in transactions and
seconds), appends outstanding, retries and lock failures, through ``partition_stats``
and the optional Prometheus collector."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from waltz_client import (
    Lock,
    Transaction,
    TransactionBuilder,
    TransactionContext,
    WaltzClient,
    WaltzClientCallbacks,
    WaltzClientConfig,
)
from waltz_client.client_metrics import register_client_metrics

pytestmark = pytest.mark.timeout(240)


def config_for(cluster, **kw) -> WaltzClientConfig:
    return WaltzClientConfig(cluster.zookeeper_connect, zk_root=cluster.layout.root, **kw)


class Put(TransactionContext):
    def __init__(self, lock: Lock | None = None) -> None:
        self.lock = lock

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_data(b"x")
        if self.lock is not None:
            builder.set_write_locks(self.lock)
        return True


class HeldBack(WaltzClientCallbacks):
    """Applies up to ``stop_at``, then waits until released."""

    def __init__(self, stop_at: int) -> None:
        self.stop_at = stop_at
        self.applied = -1
        self.release = asyncio.Event()

    def client_high_water_mark(self, partition_id: int) -> int:
        return self.applied

    async def apply_transaction(self, t: Transaction) -> None:
        if t.transaction_id > self.stop_at:
            await self.release.wait()
        self.applied = t.transaction_id


async def until(predicate, what: str, timeout: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def test_a_consumer_that_falls_behind_shows_its_lag_and_catches_up(make_cluster):
    cluster = make_cluster()

    async def scenario() -> None:
        async with WaltzClient(config_for(cluster, feed=False)) as producer:
            for _ in range(50):
                assert (await producer.submit(Put())).committed
            wrote = producer.partition_stats()[0]
            assert wrote.high_water_mark == 49 and wrote.outstanding_appends == 0
            assert not wrote.applies and wrote.lag == 0

            callbacks = HeldBack(stop_at=9)
            async with WaltzClient(config_for(cluster), callbacks) as consumer:
                stats = consumer.partition_stats
                await until(
                    lambda: stats()[0].applied == 9 and stats()[0].high_water_mark == 49,
                    "the consumer to apply 0..9 and hear of 49",
                )
                first = stats()[0]
                assert first.applies and first.lag == 40 and first.lag_seconds > 0
                await asyncio.sleep(0.3)
                later = stats()[0]
                assert later.lag == 40 and later.lag_seconds >= first.lag_seconds + 0.25

                registry = CollectorRegistry()
                register_client_metrics(consumer, "orders", registry)
                text = generate_latest(registry).decode()
                for series, value in [
                    ("lag_transactions", 40),
                    ("high_water_mark", 49),
                    ("applied_high_water_mark", 9),
                    ("mounted", 0),  # the mount's answer comes after the feed it holds back
                ]:
                    line = f'waltz_client_{series}{{client="orders",partition="0"}} {value}.0'
                    assert line in text, text

                await consumer.refresh_high_water_marks()  # asks the server: still 49
                assert stats()[0].high_water_mark == 49

                callbacks.release.set()
                await until(lambda: stats()[0].applied == 49, "the consumer to catch up")
                caught_up = stats()[0]
                assert (caught_up.lag, caught_up.lag_seconds) == (0, 0.0)
                text = generate_latest(registry).decode()
                assert 'waltz_client_lag_transactions{client="orders",partition="0"} 0.0' in text
                await until(lambda: stats()[0].mounted, "the mount's answer")

    asyncio.run(scenario())


def test_retries_and_lock_failures_are_counted(make_cluster):
    # Two contexts writing the same lock at the same high-water mark: the second is
    # refused for the lock once, then runs again and commits.
    cluster = make_cluster()

    async def scenario() -> None:
        async with WaltzClient(config_for(cluster, feed=False)) as client:
            lock = Lock("account", 7)
            results = await asyncio.gather(client.submit(Put(lock)), client.submit(Put(lock)))
            assert all(r.committed for r in results)
            assert sorted(r.attempts for r in results) == [1, 2]
            stats = client.partition_stats()[0]
            assert (stats.lock_failures, stats.retries) == (1, 1)
            assert stats.outstanding_appends == 0

            registry = CollectorRegistry()
            register_client_metrics(client, "writer", registry)
            text = generate_latest(registry).decode()
            assert 'waltz_client_lock_failures_total{client="writer",partition="0"} 1.0' in text
            assert 'waltz_client_retries_total{client="writer",partition="0"} 1.0' in text

    asyncio.run(scenario())


def test_the_collector_names_the_extra_when_prometheus_client_is_missing() -> None:
    script = textwrap.dedent(
        """
        import sys
        sys.modules["prometheus_client"] = None
        from waltz_client.client_metrics import register_client_metrics
        try:
            register_client_metrics(object(), "c")
        except ImportError as e:
            print(e)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert "pip install 'waltz[metrics]'" in out.stdout, out.stdout + out.stderr
