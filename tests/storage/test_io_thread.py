"""IoThread, a partition's own I/O thread: jobs run in the order given, off the event
loop; results and exceptions come back to the awaiting task; stop() finishes what was
given first."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from waltz_storage.io_thread import IoThread

pytestmark = pytest.mark.timeout(60)


def test_jobs_run_in_order_on_one_thread_off_the_loop() -> None:
    async def scenario() -> None:
        io = IoThread("test-io")
        seen: list[tuple[int, str]] = []

        def job(i: int) -> int:
            time.sleep(0.001 * (5 - i))  # earlier jobs are slower: order is not timing
            seen.append((i, threading.current_thread().name))
            return i * 10

        results = await asyncio.gather(*(io.run(job, i) for i in range(5)))
        assert results == [0, 10, 20, 30, 40]
        assert [i for i, _ in seen] == [0, 1, 2, 3, 4]
        assert {name for _, name in seen} == {"test-io"}
        assert threading.current_thread().name != "test-io"
        await io.stop()

    asyncio.run(scenario())


def test_an_exception_reaches_the_awaiting_task_and_the_thread_goes_on() -> None:
    async def scenario() -> None:
        io = IoThread("test-io")

        def fail(_: object) -> None:
            raise OSError(28, "No space left on device")

        with pytest.raises(OSError, match="No space left"):
            await io.run(fail, None)
        assert await io.run(lambda x: x + 1, 1) == 2
        await io.stop()

    asyncio.run(scenario())


def test_stop_finishes_the_jobs_given_and_refuses_new_ones() -> None:
    async def scenario() -> None:
        io = IoThread("test-io")
        done: list[int] = []

        def slow(i: int) -> None:
            time.sleep(0.05)
            done.append(i)

        pending = [io.run(slow, i) for i in range(3)]
        await io.stop()
        assert done == [0, 1, 2]
        assert all(f.done() for f in pending)
        with pytest.raises(RuntimeError, match="stopped"):
            io.run(slow, 9)
        await io.stop()  # twice is harmless

    asyncio.run(scenario())


def test_a_cancelled_wait_does_not_break_the_thread() -> None:
    async def scenario() -> None:
        io = IoThread("test-io")
        release = threading.Event()
        first = io.run(lambda _: release.wait(10), None)
        first.cancel()  # the awaiting task gave up; the job still runs
        release.set()
        assert await io.run(lambda x: x, "next") == "next"
        await io.stop()

    asyncio.run(scenario())
