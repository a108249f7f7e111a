"""A superseded partition object removes only itself from its server.

A partition object that kept running after its server replaced it (a crash and a
restart; Python 3.11's wait_for can swallow the cancellation that should have ended it)
may later find a newer generation. It must not take the server's current object for
the same partition down with it (the simulation, seed 77, found the owner serving
nothing after that).
"""

from __future__ import annotations

import asyncio
import uuid

from waltz_server.config import load_config
from waltz_server.partition import Partition, PartitionSettings, State
from waltz_server.recovery_manager import RecoveryContext
from waltz_server.server import WaltzServer


def partition(generation: int) -> Partition:
    context = RecoveryContext(0, generation, ("s:1",), uuid.uuid4(), 1, metadata=None)  # type: ignore[arg-type]
    return Partition(context, PartitionSettings())


def test_a_stale_partition_object_leaves_its_replacement_serving() -> None:
    async def scenario() -> None:
        server = WaltzServer(load_config(["--zookeeper", "zk:2181"], {}), coordinator=None)  # type: ignore[arg-type]
        stale, current = partition(3), partition(7)
        server.partitions[0] = current
        server.superseded(stale, "generation 7 is newer than ours (3)")
        await asyncio.sleep(0)
        assert server.partitions.get(0) is current
        assert current.state != State.STOPPED
        server.superseded(current, "generation 8 is newer than ours (7)")
        for _ in range(5):
            await asyncio.sleep(0)
        assert 0 not in server.partitions
        assert current.state == State.STOPPED

    asyncio.run(scenario())


def test_stop_ends_a_task_that_swallows_its_first_cancellation() -> None:
    """As a wait_for whose inner call finishes as the cancel arrives does on 3.11."""

    async def scenario() -> None:
        p = partition(1)
        swallowed = asyncio.Event()

        async def stubborn() -> None:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                swallowed.set()  # and go on, as if the result had won
            await asyncio.sleep(3600)

        task = asyncio.create_task(stubborn())
        p._tasks = [task]
        await asyncio.sleep(0)
        await asyncio.wait_for(p.stop("test"), 30)
        assert swallowed.is_set() and task.done()

    asyncio.run(scenario())


def test_a_partition_taken_off_is_counted_as_stopping_at_once() -> None:
    """A planned stop waits while ``holds_partitions``. A partition taken off the table
    counted as stopping only once its stop task ran: in the turn between, the stop saw
    nothing left, closed the server's storage connections under partitions still
    serving, and their ended sessions started recoveries that raced the new owners'."""

    async def scenario() -> None:
        server = WaltzServer(load_config(["--zookeeper", "zk:2181"], {}), coordinator=None)  # type: ignore[arg-type]
        server.partitions[0] = partition(7)
        server.partitions[1] = partition(7)
        server.superseded(server.partitions[0], "generation 8 is newer than ours (7)")
        assert server.holds_partitions  # no turn of the loop yet: partition 1, and 0 stopping
        server.session_lost()
        assert not server.partitions and server.holds_partitions  # both stopping
        for _ in range(20):
            await asyncio.sleep(0)
            if not server.holds_partitions:
                break
        assert not server.holds_partitions

    asyncio.run(scenario())
