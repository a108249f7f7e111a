"""The client's API against a real cluster: lazy data, flush, the outstanding-append
limit, high-water marks, range reads, lock failures and retries, the blocking facade."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest
import uvloop

from waltz_client import (
    BlockingWaltzClient,
    Lock,
    SubmitStatus,
    Transaction,
    TransactionBuilder,
    TransactionContext,
    WaltzClient,
    WaltzClientCallbacks,
    WaltzClientConfig,
)

pytestmark = pytest.mark.timeout(240)


class Put(TransactionContext):
    def __init__(self, payload: bytes, partition: int = 0, locks: tuple[Lock, ...] = ()):
        self.payload = payload
        self.partition = partition
        self.locks = locks
        self.completed: list[bool] = []
        self.lock_failures: list[int] = []

    def partition_id(self, num_partitions: int) -> int:
        return self.partition

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_header(len(self.payload))
        builder.set_data(self.payload)
        builder.set_write_locks(*self.locks)
        return True

    def on_completion(self, committed: bool) -> None:
        self.completed.append(committed)

    def on_lock_failure(self, transaction_id: int) -> None:
        self.lock_failures.append(transaction_id)


class Recorder(WaltzClientCallbacks):
    """Keeps what it is given; fetches data only when told to."""

    def __init__(self, fetch: bool) -> None:
        self.fetch = fetch
        self.hwm: dict[int, int] = {}
        self.seen: list[tuple[int, int, int]] = []
        self.data: dict[tuple[int, int], bytes] = {}

    def client_high_water_mark(self, partition_id: int) -> int:
        return self.hwm.get(partition_id, -1)

    def apply_transaction(self, t: Transaction) -> None:
        self.seen.append((t.partition_id, t.transaction_id, t.header))
        if self.fetch:
            self.data[(t.partition_id, t.transaction_id)] = t.data_blocking()
        self.hwm[t.partition_id] = t.transaction_id


def server_metric(cluster, name: str, partition: int = 0) -> float:
    total = 0.0
    for server in cluster.servers:
        url = f"http://127.0.0.1:{server.ready['http_port']}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(f'{name}{{partition="{partition}"}} '):
                    total += float(line.split()[-1])
    return total


def config_for(cluster, **kw) -> WaltzClientConfig:
    return WaltzClientConfig(cluster.zookeeper_connect, zk_root=cluster.layout.root, **kw)


def test_data_is_fetched_only_when_used_and_flush_waits_for_everything(make_cluster):
    cluster = make_cluster()

    async def scenario() -> None:
        lazy = Recorder(fetch=False)
        async with WaltzClient(config_for(cluster), lazy) as client:
            contexts = [Put(b"payload-%d" % i) for i in range(50)]
            submissions = [asyncio.ensure_future(client.submit(c)) for c in contexts]
            await client.flush()
            assert all(s.done() for s in submissions)
            assert all(c.completed == [True] for c in contexts)
            results = [s.result() for s in submissions]
            assert sorted(r.transaction_id for r in results) == list(range(50))
            for _ in range(100):
                if len(lazy.seen) == 50:
                    break
                await asyncio.sleep(0.05)
            assert [s[1] for s in lazy.seen] == list(range(50))
            # Concurrent submissions commit in whichever order their executions finish (a
            # synchronous client_high_water_mark runs on a thread pool): each transaction
            # carries its own context's header.
            headers = {txid: header for _, txid, header in lazy.seen}
            assert all(
                headers[r.transaction_id] == len(c.payload)
                for r, c in zip(results, contexts, strict=True)
            )
        # Nobody asked for data: the server served none.
        hits = server_metric(cluster, "waltz_server_partition_data_cache_hits_total")
        misses = server_metric(cluster, "waltz_server_partition_data_cache_misses_total")
        assert hits + misses == 0

        eager = Recorder(fetch=True)
        async with WaltzClient(config_for(cluster), eager) as client:
            for _ in range(100):
                if len(eager.data) == 50:
                    break
                await asyncio.sleep(0.05)
        assert eager.data == {
            (0, r.transaction_id): c.payload for r, c in zip(results, contexts, strict=True)
        }
        assert server_metric(cluster, "waltz_server_partition_data_cache_hits_total") == 50

    asyncio.run(scenario())


def test_submit_waits_beyond_the_outstanding_limit(make_cluster):
    cluster = make_cluster()

    async def scenario() -> None:
        config = config_for(cluster, max_outstanding_appends=3, feed=False)
        async with WaltzClient(config) as client:
            await client.submit(Put(b"warm-up"))
            cluster.storages[1].pause()
            cluster.storages[2].pause()  # nothing can commit
            try:
                submissions = [asyncio.ensure_future(client.submit(Put(b"x"))) for _ in range(10)]
                await asyncio.sleep(2)
                assert server_metric(cluster, "waltz_server_partition_appended_total") == 1 + 3
                assert not any(s.done() for s in submissions)
            finally:
                cluster.storages[1].resume()
                cluster.storages[2].resume()
            results = await asyncio.gather(*submissions)
            assert {r.status for r in results} == {SubmitStatus.COMMITTED}

    asyncio.run(scenario())


def test_lock_failures_retry_against_the_newer_state(make_cluster):
    cluster = make_cluster()
    account = Lock("account", 7)

    async def scenario() -> None:
        async with WaltzClient(config_for(cluster), Recorder(fetch=False)) as client:
            contexts = [Put(b"debit-%d" % i, locks=(account,)) for i in range(10)]
            results = await asyncio.gather(*(client.submit(c) for c in contexts))
            assert {r.status for r in results} == {SubmitStatus.COMMITTED}
            # Computed against the same state, they collided and were retried.
            assert sum(len(c.lock_failures) for c in contexts) > 0
            assert sum(r.attempts for r in results) > 10
            assert sorted(r.transaction_id for r in results) == list(range(10))

    asyncio.run(scenario())


def test_high_water_marks_range_reads_and_the_blocking_facade(make_cluster):
    cluster = make_cluster(partitions=2)
    config = config_for(cluster, feed=False)
    with BlockingWaltzClient(config) as client:
        assert isinstance(client._loop, uvloop.Loop)  # its loop thread runs uvloop
        assert client.num_partitions == 2
        for i in range(30):
            result = client.submit(Put(json.dumps({"i": i}).encode(), partition=i % 2))
            assert result.committed
        client.flush()
        assert client.high_water_mark(0) == 14 and client.high_water_mark(1) == 14
        records = list(client.read(1))
        assert [r.transaction_id for r in records] == list(range(15))
        assert [json.loads(r.data)["i"] for r in records] == list(range(1, 30, 2))
        assert [r.transaction_id for r in client.read(0, 3, 5)] == [3, 4, 5]
        assert client.transaction_data(0, 2) == b'{"i": 4}'
        with pytest.raises(LookupError, match="not committed"):
            client.transaction_data(0, 99)


def test_a_context_that_gives_up_or_raises(make_cluster):
    cluster = make_cluster()

    class GiveUp(Put):
        def execute(self, builder: TransactionBuilder) -> bool:
            return False

    class Broken(Put):
        def __init__(self) -> None:
            super().__init__(b"")
            self.errors: list[BaseException] = []

        def execute(self, builder: TransactionBuilder) -> bool:
            raise RuntimeError("no such account")

        def on_exception(self, error: BaseException) -> None:
            self.errors.append(error)

    async def scenario() -> None:
        async with WaltzClient(config_for(cluster, feed=False)) as client:
            give_up = GiveUp(b"")
            assert (await client.submit(give_up)).status == SubmitStatus.IGNORED
            assert give_up.completed == [False]
            broken = Broken()
            result = await client.submit(broken)
            assert result.status == SubmitStatus.FAILED
            assert result.reason == "Broken.execute raised RuntimeError('no such account')"
            assert broken.completed == [] and len(broken.errors) == 1  # on_exception alone
            with pytest.raises(ValueError, match="partitions"):
                await client.submit(Put(b"", partition=5))
            assert await client.high_water_mark(0) == -1

    asyncio.run(scenario())


def test_a_failing_client_high_water_mark_is_named_as_the_culprit(make_cluster):
    # A database error while reading the application's mark before execute() fails the
    # submission naming client_high_water_mark, not execute (which never ran).
    cluster = make_cluster()

    class BrokenMarks(Recorder):
        reads = 0

        def client_high_water_mark(self, partition_id: int) -> int:
            self.reads += 1
            if self.reads > 1:  # the mount's read works; the submission's does not
                raise RuntimeError("current transaction is aborted")
            return super().client_high_water_mark(partition_id)

    class Recorded(Put):
        executed = 0

        def execute(self, builder: TransactionBuilder) -> bool:
            self.executed += 1
            return super().execute(builder)

    async def scenario() -> None:
        callbacks = BrokenMarks(fetch=False)
        async with WaltzClient(config_for(cluster), callbacks) as client:
            put = Recorded(b"x")
            result = await client.submit(put)
            assert result.status == SubmitStatus.FAILED
            assert result.reason.startswith("BrokenMarks.client_high_water_mark raised")
            assert "current transaction is aborted" in result.reason
            assert put.executed == 0

    asyncio.run(scenario())


def test_async_callbacks_run_on_the_event_loop(make_cluster):
    cluster = make_cluster()

    class AsyncRecorder(WaltzClientCallbacks):
        def __init__(self) -> None:
            self.hwm = -1
            self.data: list[bytes] = []
            self.failed_once = False

        async def client_high_water_mark(self, partition_id: int) -> int:
            return self.hwm

        async def apply_transaction(self, t: Transaction) -> None:
            if t.transaction_id == 3 and not self.failed_once:
                self.failed_once = True
                raise RuntimeError("the database is briefly away")
            self.data.append(await t.data())
            self.hwm = t.transaction_id

        async def uncaught_exception(self, partition_id, transaction_id, error) -> None:
            self.error = (partition_id, transaction_id, str(error))

    async def scenario() -> None:
        callbacks = AsyncRecorder()
        async with WaltzClient(config_for(cluster), callbacks) as client:
            for i in range(6):
                assert (await client.submit(Put(b"a-%d" % i))).committed
            for _ in range(200):
                if callbacks.hwm == 5:
                    break
                await asyncio.sleep(0.05)
        # Transaction 3 failed once, was delivered again, and nothing was skipped or doubled.
        assert callbacks.error == (0, 3, "the database is briefly away")
        assert callbacks.data == [b"a-%d" % i for i in range(6)]

    asyncio.run(scenario())


def test_close_releases_waiting_submissions_and_bad_appends_fail_clearly(make_cluster):
    cluster = make_cluster()

    class Huge(Put):
        def execute(self, builder: TransactionBuilder) -> bool:
            builder.set_data(b"x" * (16 * 1024 * 1024 + 1))
            return True

    class AsyncPut(Put):
        async def execute(self, builder: TransactionBuilder) -> bool:  # type: ignore[override]
            await asyncio.sleep(0)
            builder.set_data(self.payload)
            return True

    async def scenario() -> None:
        client = await WaltzClient(config_for(cluster, feed=False)).start()
        huge = await client.submit(Huge(b""))
        assert huge.status == SubmitStatus.FAILED and "exceeds" in huge.reason
        assert (await client.submit(AsyncPut(b"async execute"))).committed
        assert [r.data async for r in client.read(0)] == [b"async execute"]
        with pytest.raises(ValueError, match="start >= 0"):
            [r async for r in client.read(0, -5)]
        cluster.storages[1].pause()
        cluster.storages[2].pause()  # nothing commits: the submission waits...
        try:
            waiting = asyncio.ensure_future(client.submit(Put(b"stuck")))
            await asyncio.sleep(1)
            assert not waiting.done()
            await client.close()  # ...until the client closes
            result = await asyncio.wait_for(waiting, 10)
            assert result.status == SubmitStatus.FAILED and "closed" in result.reason
        finally:
            cluster.storages[1].resume()
            cluster.storages[2].resume()

    asyncio.run(scenario())


def test_a_slow_consumer_holds_back_the_feed_instead_of_buffering_it(make_cluster):
    cluster = make_cluster()
    n = 6000

    class Slow(WaltzClientCallbacks):
        def __init__(self) -> None:
            self.hwm = -1
            self.most_queued = 0
            self.client: WaltzClient | None = None

        async def client_high_water_mark(self, partition_id: int) -> int:
            return self.hwm

        async def apply_transaction(self, t: Transaction) -> None:
            assert self.client is not None
            queued = self.client._partitions[0].inbox.qsize()
            self.most_queued = max(self.most_queued, queued)
            if t.transaction_id % 10 == 0:
                await asyncio.sleep(0.01)  # a slow database
            self.hwm = t.transaction_id

    async def scenario() -> None:
        slow = Slow()
        client = WaltzClient(config_for(cluster), slow)
        slow.client = client
        async with client:
            # Written in many small rounds while the consumer lags: many feed frames.
            async with WaltzClient(config_for(cluster, feed=False)) as writer:
                for r in range(n // 20):
                    await asyncio.gather(
                        *(writer.submit(Put(b"f-%d" % (20 * r + i))) for i in range(20))
                    )
            for _ in range(600):
                if slow.hwm == n - 1:
                    break
                await asyncio.sleep(0.05)
        assert slow.hwm == n - 1
        # Without back pressure hundreds of feed frames would wait in the inbox.
        assert slow.most_queued <= 70, slow.most_queued

    asyncio.run(scenario())
