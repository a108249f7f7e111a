"""spawn: background tasks are held until they end, and their failures are logged."""

from __future__ import annotations

import asyncio
import logging

from waltz_client.runtime.tasks import spawn

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
