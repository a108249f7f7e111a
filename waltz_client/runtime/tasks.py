"""Background tasks that are neither lost nor silent.

asyncio keeps only a weak reference to a task: one nobody holds may be collected
midway, and one that fails with nobody awaiting it logs "exception was never retrieved"
at exit, if ever. ``spawn`` keeps the task in a set until it ends and logs its failure.

``wait_for`` replaces ``asyncio.wait_for``, which on Python 3.11 loses a cancellation
that arrives as the awaited future completes (it returns the result instead): a task
cancelled at close then runs on, and whoever awaits its end waits forever.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

from waltz_client.wire.errors import describe

T = TypeVar("T")


def spawn(
    coro: Coroutine[Any, Any, Any],
    tasks: set[asyncio.Task[Any]],
    what: str,
    log: logging.Logger,
) -> asyncio.Task[Any]:
    """Run ``coro`` in the background, held in ``tasks`` until it ends; a failure is logged
    with ``what`` it was doing."""
    task = asyncio.get_running_loop().create_task(coro)
    tasks.add(task)

    def done(t: asyncio.Task[Any]) -> None:
        tasks.discard(t)
        if not t.cancelled() and (error := t.exception()) is not None:
            log.error("%s failed: %s", what, describe(error), exc_info=error)

    task.add_done_callback(done)
    return task


async def wait_for(awaitable: Awaitable[T], timeout: float | None) -> T:
    """``awaitable``'s result, or TimeoutError after ``timeout`` seconds (None: no limit),
    as ``asyncio.wait_for`` but never swallowing the caller's cancellation."""
    async with asyncio.timeout(timeout):
        return await awaitable
