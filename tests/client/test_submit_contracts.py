"""The promises of ``submit`` and the context's hooks, on a real cluster: ``submit``
returns once this client applied its own transaction; exactly one hook ends a
submission (``on_completion`` True or False, ``on_exception``, ``on_expiration``); a
context's deadline expires it when no attempt can be made."""

from __future__ import annotations

import asyncio
import time

import pytest

from waltz_client import (
    SubmitStatus,
    Transaction,
    TransactionBuilder,
    TransactionContext,
    WaltzClient,
    WaltzClientCallbacks,
    WaltzClientConfig,
)
from waltz_client.errors import SubmissionFailed

pytestmark = pytest.mark.timeout(240)


def config_for(cluster, **kw) -> WaltzClientConfig:
    return WaltzClientConfig(cluster.zookeeper_connect, zk_root=cluster.layout.root, **kw)


class Hooked(TransactionContext):
    """Writes ``payload``; records every hook it hears, in order."""

    def __init__(self, payload: bytes = b"x", give_up: bool = False) -> None:
        self.payload = payload
        self.give_up = give_up
        self.heard: list[tuple] = []

    def execute(self, builder: TransactionBuilder) -> bool:
        if self.give_up:
            return False
        builder.set_data(self.payload)
        return True

    def on_completion(self, committed: bool) -> None:
        self.heard.append(("completion", committed))

    def on_exception(self, error: BaseException) -> None:
        self.heard.append(("exception", error))

    def on_expiration(self) -> None:
        self.heard.append(("expiration",))


class FailsOnceThenApplies(WaltzClientCallbacks):
    """``apply_transaction`` raises the first time it meets each transaction."""

    def __init__(self) -> None:
        self.applied = -1
        self.failed: set[int] = set()

    def client_high_water_mark(self, partition_id: int) -> int:
        return self.applied

    def apply_transaction(self, t: Transaction) -> None:
        if t.transaction_id not in self.failed:
            self.failed.add(t.transaction_id)
            raise RuntimeError("the database hiccuped")
        self.applied = t.transaction_id

    def uncaught_exception(self, partition_id: int, transaction_id: int, e: Exception) -> None:
        pass


def test_submit_returns_only_once_its_own_transaction_is_applied(make_cluster):
    # apply_transaction raises on the first delivery of each transaction: the client
    # mounts again and delivers it anew. submit must not return in between.
    cluster = make_cluster()

    async def scenario() -> None:
        callbacks = FailsOnceThenApplies()
        async with WaltzClient(config_for(cluster, retry_backoff=0.2), callbacks) as client:
            for i in range(3):
                ctx = Hooked(b"t%d" % i)
                result = await client.submit(ctx)
                assert result.status == SubmitStatus.COMMITTED
                assert callbacks.applied >= result.transaction_id, (
                    f"submit returned {result.transaction_id} before the client applied it "
                    f"(applied up to {callbacks.applied})"
                )
                assert result.transaction_id in callbacks.failed  # it did fail once first
                assert ctx.heard == [("completion", True)]

    asyncio.run(scenario())


def test_each_ending_is_heard_through_exactly_one_hook(make_cluster):
    cluster = make_cluster()

    class Broken(Hooked):
        def execute(self, builder: TransactionBuilder) -> bool:
            raise RuntimeError("no such account")

    async def scenario() -> None:
        async with WaltzClient(config_for(cluster, feed=False)) as client:
            committed = Hooked()
            assert (await client.submit(committed)).committed
            assert committed.heard == [("completion", True)]

            ignored = Hooked(give_up=True)
            assert (await client.submit(ignored)).status == SubmitStatus.IGNORED
            assert ignored.heard == [("completion", False)]

            broken = Broken()
            result = await client.submit(broken)
            assert result.status == SubmitStatus.FAILED
            assert [h[0] for h in broken.heard] == ["exception"]
            assert isinstance(broken.heard[0][1], RuntimeError)

            # Out of executions: a too-big append is refused before it is sent, so
            # FAILED with a reason; the hook gets a SubmissionFailed naming it.
            too_big = Hooked(b"x" * (16 * 1024 * 1024 + 1))
            result = await client.submit(too_big)
            assert result.status == SubmitStatus.FAILED
            assert [h[0] for h in too_big.heard] == ["exception"]
            assert "exceeds" in str(too_big.heard[0][1])

            pending = asyncio.ensure_future(client.submit(closed := Hooked()))
            await asyncio.sleep(0)
        result = await pending
        if result.status == SubmitStatus.FAILED:  # the close won the race
            assert [h[0] for h in closed.heard] == ["exception"]
            assert isinstance(closed.heard[0][1], SubmissionFailed)
        else:
            assert closed.heard == [("completion", True)]

    asyncio.run(scenario())


def test_a_context_that_cannot_be_appended_in_time_expires(make_cluster):
    # The only server is gone: no mount, so no attempt can be made. The context's own
    # deadline ends it as EXPIRED (not FAILED after max_retries), heard by on_expiration.
    cluster = make_cluster()

    async def scenario() -> None:
        config = config_for(cluster, feed=False, transaction_timeout=None)
        async with WaltzClient(config) as client:
            assert (await client.submit(Hooked())).committed
            cluster.servers[0].kill()
            await asyncio.sleep(0.5)

            class Quick(Hooked):
                timeout = 2.0

            ctx = Quick()
            started = time.monotonic()
            result = await asyncio.wait_for(client.submit(ctx), 60)
            assert result.status == SubmitStatus.EXPIRED, result
            assert time.monotonic() - started >= 2.0
            assert ctx.heard == [("expiration",)]
            assert result.reason.startswith("expired after")

    asyncio.run(scenario())


def test_the_deadline_settings_are_checked(make_cluster):
    with pytest.raises(ValueError, match="transaction_timeout"):
        WaltzClientConfig("127.0.0.1:1", transaction_timeout=0)
    assert WaltzClientConfig("127.0.0.1:1", transaction_timeout=None).transaction_timeout is None
    cluster = make_cluster()

    class Bad(Hooked):
        timeout = -1

    async def scenario() -> None:
        async with WaltzClient(config_for(cluster, feed=False)) as client:
            with pytest.raises(ValueError, match=r"Bad\.timeout must be None or > 0"):
                await client.submit(Bad())

    asyncio.run(scenario())
