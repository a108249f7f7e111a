"""kazoo's asynchronous results, awaited on an asyncio loop.

kazoo's blocking calls, run in a thread pool, hold a thread each for a whole ZooKeeper
round trip: with the default pool's few threads, a server recovering a hundred
partitions at once wrote their metadata a handful at a time. Its ``*_async`` calls
queue the request on the one connection and return at once, so every request of every
partition is in flight together (ZooKeeper answers them in order); this bridges their
results to the loop.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kazoo.interfaces import IAsyncResult


def _settle(future: asyncio.Future[Any], result: IAsyncResult) -> None:
    if future.done():  # the awaiting task gave up (cancelled)
        return
    try:
        future.set_result(result.get_nowait())
    except Exception as e:  # kazoo's error for the request (NoNodeError, BadVersionError...)
        future.set_exception(e)


async def completed(result: IAsyncResult) -> Any:
    """The value of a kazoo asynchronous ``result`` (``zk.get_async(...)``,
    ``transaction.commit_async()``...), or its exception raised, once ZooKeeper answers.
    Call from the loop's thread; kazoo calls back from its own."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def done(r: IAsyncResult) -> None:
        if not loop.is_closed():
            loop.call_soon_threadsafe(_settle, future, r)

    result.rawlink(done)
    return await future
