"""spawn: background tasks are held until they end, and their failures are logged.
wait_for: a time limit that never loses a cancellation."""

from __future__ import annotations

import asyncio
import logging

import pytest

from waltz_client.runtime.tasks import spawn, wait_for

log = logging.getLogger("test-tasks")


def test_a_background_task_is_held_until_it_ends_and_its_failure_logged(caplog):
    async def fails() -> None:
        await asyncio.sleep(0.01)
        raise TimeoutError

    async def scenario() -> None:
        tasks: set[asyncio.Task] = set()
        ok = spawn(asyncio.sleep(0.01), tasks, "sleeping", log)
        bad = spawn(fails(), tasks, "stopping partition 3", log)
        assert tasks == {ok, bad}
        await asyncio.wait({ok, bad})
        await asyncio.sleep(0)
        assert tasks == set()

    with caplog.at_level(logging.ERROR, logger="test-tasks"):
        asyncio.run(scenario())
    assert "stopping partition 3 failed: timed out" in caplog.text
    assert "sleeping" not in caplog.text


def test_a_cancellation_arriving_as_the_awaited_future_completes_is_not_lost():
    """The client's close hung this way: its mount loop was cancelled in the same loop
    turn as the mount answer arrived, asyncio.wait_for (Python 3.11) returned the answer
    instead, and the loop went on to wait for a remount that never came."""

    async def scenario() -> None:
        answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        ran_on = asyncio.Event()

        async def mount_loop() -> None:
            await wait_for(answer, 60)
            ran_on.set()
            await asyncio.Event().wait()  # what the mount loop waits for next

        task = asyncio.get_running_loop().create_task(mount_loop())
        await asyncio.sleep(0)  # the task now waits for the answer
        answer.set_result("READY")
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=30)
        assert done == {task}, "the cancelled task ran on"
        assert task.cancelled()
        assert not ran_on.is_set()

    asyncio.run(scenario())


def test_wait_for_returns_the_result_or_times_out():
    async def scenario() -> None:
        assert await wait_for(asyncio.sleep(0, "done"), 5) == "done"
        assert await wait_for(asyncio.sleep(0, "no limit"), None) == "no limit"
        never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with pytest.raises(TimeoutError):
            await wait_for(never, 0.01)
        assert never.cancelled()

    asyncio.run(scenario())
