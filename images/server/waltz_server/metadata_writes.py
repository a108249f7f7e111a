"""Compare-and-sets of partition metadata made in one loop turn, as one ZooKeeper multi.

A server that takes a hundred partitions at once writes each one's metadata twice while
recovering them (a new session ID, then the session's members). One request a write
queues them one behind another in ZooKeeper's commit pipeline: 128 writes in flight
together took 30-50 ms on an idle machine here, one multi of the same writes 5-16 ms.
So the writes requested in one turn of the event loop go to ZooKeeper together.

A multi is all or nothing. When one fails (a write whose version moved: a newer owner,
or the replica assignment changed), each of its writes is made again on its own, and
lands or fails exactly as it would have alone. ``batches`` is the decision (which writes
may share a multi); ``MetadataWriter`` the shell.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError

from waltz_client.cluster.zk_async import completed

from .recovery_manager import AssignmentChanged, MetadataConflict

log = logging.getLogger(__name__)

# Writes a multi at most: a partition's metadata is a few hundred bytes, and ZooKeeper
# refuses a request above jute.maxbuffer (1 MiB by default).
MOST_A_MULTI = 100


@dataclass(frozen=True, slots=True)
class MetadataWrite:
    partition_id: int
    path: str
    data: bytes
    version: int  # the version it replaces (compare-and-set)
    # The replica assignment's znode version, checked in the same transaction (the
    # session names members recovered with it); None: not checked.
    assignment_version: int | None


def batches(writes: list[MetadataWrite], most: int = MOST_A_MULTI) -> list[list[MetadataWrite]]:
    """The writes grouped into multis, in order: those checking the same assignment
    version (or none) together, at most ``most`` a multi. A multi checks one version;
    mixing writes that check none with those that do would fail them all together
    whenever the check fails."""
    groups: dict[int | None, list[MetadataWrite]] = {}
    for write in writes:
        groups.setdefault(write.assignment_version, []).append(write)
    return [group[i : i + most] for group in groups.values() for i in range(0, len(group), most)]


class MetadataWriter:
    """``write`` a partition's metadata by compare-and-set; the writes of one loop turn
    share a ZooKeeper multi (see the module)."""

    def __init__(self, zk: Callable[[], KazooClient], assignment_path: str) -> None:
        self._zk = zk
        self._assignment_path = assignment_path
        self._queued: list[tuple[MetadataWrite, asyncio.Future[int]]] = []
        self._commits: set[asyncio.Task[None]] = set()
        self.multis = 0  # multis committed, for tests and the curious

    async def write(self, write: MetadataWrite) -> int:
        """The metadata's new version. Raises MetadataConflict (its version moved) or
        AssignmentChanged (the assignment's version did)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        self._queued.append((write, future))
        if len(self._queued) == 1:
            loop.call_soon(self._flush)
        return await future

    def _flush(self) -> None:
        queued = [(w, f) for w, f in self._queued if not f.done()]  # not cancelled
        self._queued = []
        futures = {id(w): f for w, f in queued}
        for batch in batches([w for w, _ in queued]):
            commit = asyncio.get_running_loop().create_task(
                self._commit([(w, futures[id(w)]) for w in batch])
            )
            self._commits.add(commit)
            commit.add_done_callback(self._commits.discard)

    async def _commit(self, batch: list[tuple[MetadataWrite, asyncio.Future[int]]]) -> None:
        try:
            if len(batch) > 1 and await self._multi(batch):
                return
            await asyncio.gather(*(self._alone(write, future) for write, future in batch))
        except Exception as e:  # not connected, the connection lost: each would fail so
            for _, future in batch:
                _settle(future, error=e)
        except asyncio.CancelledError:  # the loop shuts down: no write waits for ever
            for _, future in batch:
                _settle(future, error=ConnectionError("metadata write abandoned"))
            raise

    async def _multi(self, batch: list[tuple[MetadataWrite, asyncio.Future[int]]]) -> bool:
        """Commit the batch as one multi; False when it failed on a version (nothing
        written: each is then written alone)."""
        transaction = self._zk().transaction()
        checked = batch[0][0].assignment_version
        if checked is not None:
            transaction.check(self._assignment_path, checked)
        for write, _ in batch:
            transaction.set_data(write.path, write.data, write.version)
        results = await completed(transaction.commit_async())
        if any(isinstance(r, Exception) for r in results):
            log.debug("a multi of %d metadata writes failed; each again alone", len(batch))
            return False
        self.multis += 1
        stats = results[1:] if checked is not None else results
        for (_, future), stat in zip(batch, stats, strict=True):
            _settle(future, stat.version)
        return True

    async def _alone(self, write: MetadataWrite, future: asyncio.Future[int]) -> None:
        try:
            _settle(future, await self._write_alone(write))
        except Exception as e:
            _settle(future, error=e)

    async def _write_alone(self, write: MetadataWrite) -> int:
        zk = self._zk()
        if write.assignment_version is None:
            try:
                stat = await completed(zk.set_async(write.path, write.data, write.version))
            except BadVersionError:
                raise MetadataConflict(f"{write.path} changed under us") from None
            return stat.version
        transaction = zk.transaction()
        transaction.check(self._assignment_path, write.assignment_version)
        transaction.set_data(write.path, write.data, write.version)
        checked, written = await completed(transaction.commit_async())
        if isinstance(checked, BadVersionError):
            raise AssignmentChanged(
                f"the replica assignment changed (partition {write.partition_id})"
            )
        if isinstance(written, BadVersionError):
            raise MetadataConflict(f"{write.path} changed under us")
        if isinstance(checked, Exception) or isinstance(written, Exception):
            raise MetadataConflict(f"writing {write.path} failed: {checked!r}, {written!r}")
        return written.version


def _settle(
    future: asyncio.Future[int], version: int = -1, error: BaseException | None = None
) -> None:
    if future.done():  # its recovery gave up meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(version)
