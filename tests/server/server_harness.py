"""Helpers for the server tests (the cluster fixtures come from tests/conftest.py): reading
a cluster's metadata and replicas, waiting for conditions, and a small protocol-level
client of one partition. A module of its own name, not a conftest.py: every conftest.py
is a module named ``conftest``, and ``from conftest import`` found whichever was loaded
first.

``PartitionClient`` speaks the client <-> server messages directly (the
client library is built on the same messages); it records what a client
can observe: the feed, lock failures, mount and flush answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time

from waltz_client import WaltzClient, WaltzClientConfig
from waltz_client.cluster.metadata import PartitionMetadata
from waltz_client.cluster.paths import ClusterPaths
from waltz_client.cluster.zk import close, connect
from waltz_client.tools.local.cluster import LocalCluster
from waltz_client.transaction import TransactionBuilder, TransactionContext
from waltz_client.wire.client_messages import (
    AllocateClientIdRequest,
    AppendRequest,
    ClientIdAllocated,
    ClientMessage,
    FeedData,
    FeedSuspended,
    FlushRequest,
    FlushResponse,
    LockFailure,
    MountRequest,
    MountResponse,
    MountStatus,
)
from waltz_client.wire.records import RecordHeader, ReqId
from waltz_client.wire.server_connection import ServerConnection
from waltz_storage.inspect import read_records, segment_paths


class Put(TransactionContext):
    """Append ``data`` (with ``header``) to ``partition``, no locks."""

    def __init__(self, data: bytes = b"x", partition: int = 0, header: int = 0) -> None:
        self.data, self.target, self.header = data, partition, header

    def partition_id(self, num_partitions: int) -> int:
        return self.target

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_header(self.header)
        builder.set_data(self.data)
        return True


async def write_each(cluster: LocalCluster, partitions: range, count: int, tag: bytes) -> None:
    """``count`` transactions ``<tag>-<partition>-<i>`` into each partition, all committed."""
    config = WaltzClientConfig(cluster.zookeeper_connect, zk_root=cluster.layout.root, feed=False)
    async with WaltzClient(config) as producer:
        results = await asyncio.gather(
            *(
                producer.submit(Put(b"%s-%d-%d" % (tag, p, i), p))
                for p in partitions
                for i in range(count)
            )
        )
        assert all(r.committed for r in results), [r for r in results if not r.committed]


def read_all(cluster: LocalCluster, partition: int) -> list[bytes]:
    """Every committed transaction's data of the partition, in order (a range read)."""

    async def read() -> list[bytes]:
        config = WaltzClientConfig(
            cluster.zookeeper_connect, zk_root=cluster.layout.root, feed=False
        )
        async with WaltzClient(config) as reader:
            return [r.data async for r in reader.read(partition)]

    return asyncio.run(read())


def longest_gap_while_paused(
    cluster: LocalCluster,
    config: WaltzClientConfig,
    data: bytes,
    in_flight: int,
    settled_after: float,
) -> float:
    """Storage node 1 paused under a writer keeping ``in_flight`` appends of ``data`` in
    flight on partition 0: the longest time (s) without a commit from the pause until
    commits have gone on for a while, ``settled_after`` seconds after it."""

    async def scenario() -> float:
        commits: list[float] = []
        async with WaltzClient(config) as client:

            async def write() -> None:
                while True:
                    results = await asyncio.gather(
                        *(client.submit(Put(data)) for _ in range(in_flight))
                    )
                    assert all(r.committed for r in results)
                    commits.append(time.monotonic())

            writer = asyncio.ensure_future(write())
            await asyncio.sleep(2)
            cluster.storages[1].pause()
            paused = time.monotonic()
            try:
                while time.monotonic() - paused < settled_after + 35:
                    await asyncio.sleep(0.5)
                    if commits and commits[-1] - paused > settled_after and len(commits) > 10:
                        break  # well after the session left it: commits go on
            finally:
                cluster.storages[1].resume()
                writer.cancel()
                await asyncio.gather(writer, return_exceptions=True)
        after = [paused, *[t for t in commits if t > paused]]
        return max(b - a for a, b in itertools.pairwise(after))

    return asyncio.run(scenario())


def ownership(cluster: LocalCluster) -> dict[int, tuple[str | None, int]]:
    return cluster.ownership()


def partition_metadata(cluster: LocalCluster, partition: int) -> PartitionMetadata:
    zk = connect(cluster.zookeeper_connect)
    try:
        data, _ = zk.get(ClusterPaths.of(cluster.layout.root).partition(partition))
        return PartitionMetadata.decode(data)
    finally:
        close(zk)


def cluster_admin(cluster: LocalCluster, call, *args):
    """Run an admin library call (``waltz_client.cluster.admin``) against the cluster."""
    zk = connect(cluster.zookeeper_connect)
    try:
        return call(zk, cluster.layout.root, *args)
    finally:
        close(zk)


def wait_for(predicate, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.1)


async def until(predicate, what: str, timeout: float = 120.0) -> None:
    """``wait_for`` for a test's event loop (a hang guard: it ends once the condition holds)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.02)


def owner_of(cluster: LocalCluster, partition: int, not_server: str | None = None):
    """(server index, generation) once the partition has a live owner (other than
    ``not_server``)."""
    return cluster.owner_index(partition, not_server)


def replica_logs(cluster: LocalCluster, partition: int) -> list[list]:
    """Every storage node's records of the partition, read from its files (stop it first)."""
    logs = []
    for i in range(len(cluster.storages)):
        directory = os.path.join(cluster.data_dir, f"storage-{i}", str(partition))
        records = []
        if os.path.isdir(directory):
            for path in segment_paths(directory):
                records += [r for _, r, problem in read_records(path) if problem is None]
        logs.append(records)
    return logs


class PartitionClient:
    """One client's view of one partition, over one stream connection."""

    _ids = itertools.count(1000)

    def __init__(self, cluster: LocalCluster, partition: int, client_id: int | None = None):
        self.cluster = cluster
        self.partition = partition
        self.client_id = client_id if client_id is not None else next(self._ids)
        # On mutual TLS a client ID must be allocated to our certificate (by a server).
        self._allocated = client_id is not None or cluster.pki is None
        self.connection_seq = 0
        self.generation = -1
        self.conn: ServerConnection | None = None
        self.feed: list[RecordHeader] = []
        self.lock_failures: dict[ReqId, int] = {}
        self.suspended: list[str] = []
        self._seq = itertools.count(1)
        self._waiters: dict[ReqId, asyncio.Future] = {}
        self._feed_changed = asyncio.Event()

    @property
    def high_water_mark(self) -> int:
        return self.feed[-1].transaction_id if self.feed else -1

    def req_id(self) -> ReqId:
        return ReqId(self.client_id, self.generation, self.partition, next(self._seq))

    def _on_message(self, m: ClientMessage) -> None:
        if isinstance(m, FeedData):
            for h in m.headers:
                assert h.transaction_id == self.high_water_mark + 1, (
                    f"feed gap or repeat: {h.transaction_id} after {self.high_water_mark}"
                )
                self.feed.append(h)
            self._feed_changed.set()
        elif isinstance(m, LockFailure):
            self.lock_failures[m.req_id] = m.transaction_id
        elif isinstance(m, FeedSuspended):
            self.suspended.append(m.reason)
        future = self._waiters.pop(m.req_id, None)
        if future is not None and not future.done():
            future.set_result(m)

    async def mount(self, timeout: float = 60.0) -> None:
        """Find the owner and mount at our high-water mark (again after a move)."""
        deadline = time.monotonic() + timeout
        while True:
            if self.conn is not None:
                await self.conn.close()
                self.conn = None
            index, self.generation = await asyncio.to_thread(owner_of, self.cluster, self.partition)
            port = self.cluster.servers[index].ready["port"]
            try:
                self.conn = await ServerConnection.connect(
                    "127.0.0.1",
                    port,
                    on_message=self._on_message,
                    open_connection=self.cluster.client_open_connection(),
                )
                if not self._allocated:
                    q = ReqId(-1, -1, self.partition, next(self._seq))
                    answer = self._expect(q)
                    self.conn.send(AllocateClientIdRequest(q))
                    allocated = await asyncio.wait_for(answer, 30)
                    if isinstance(allocated, ClientIdAllocated):
                        self.client_id, self._allocated = allocated.client_id, True
                self.connection_seq += 1
                q = self.req_id()
                answer = self._expect(q)
                self.conn.send(MountRequest(q, self.high_water_mark, self.connection_seq))
                response = await asyncio.wait_for(answer, max(1.0, deadline - time.monotonic()))
                if isinstance(response, MountResponse) and response.status == MountStatus.READY:
                    return
            except (TimeoutError, OSError):
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"could not mount partition {self.partition}")
            await asyncio.sleep(0.3)

    def _expect(self, q: ReqId) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self._waiters[q] = future
        return future

    def append(
        self,
        data: bytes,
        *,
        write_locks: tuple[int, ...] = (),
        read_locks: tuple[int, ...] = (),
        append_locks: tuple[int, ...] = (),
        client_high_water_mark: int | None = None,
        header: int = 0,
    ) -> ReqId:
        assert self.conn is not None
        q = self.req_id()
        hwm = self.high_water_mark if client_high_water_mark is None else client_high_water_mark
        self.conn.send(AppendRequest(q, hwm, write_locks, read_locks, append_locks, header, data))
        return q

    async def flush(self, timeout: float = 60.0) -> int:
        assert self.conn is not None
        q = self.req_id()
        answer = self._expect(q)
        self.conn.send(FlushRequest(q))
        response = await asyncio.wait_for(answer, timeout)
        assert isinstance(response, FlushResponse), response
        return response.transaction_id

    async def wait_feed(self, txid: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while self.high_water_mark < txid:
            self._feed_changed.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"feed stopped at {self.high_water_mark}, waiting for {txid}")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._feed_changed.wait(), remaining)

    def committed(self) -> set[ReqId]:
        return {h.req_id for h in self.feed}

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()
