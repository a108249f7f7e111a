"""Background tasks that are neither lost nor silent.

asyncio keeps only a weak reference to a task: one nobody holds may be collected
midway, and one that fails with nobody awaiting it logs "exception was never retrieved"
at exit, if ever. ``spawn`` keeps the task in a set until it ends and logs its failure.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from waltz_client.wire.errors import describe


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
