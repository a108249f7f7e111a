"""Each partition's log start, the first transaction still in the log (retention moves
it up), as the owning server records it in the partition's metadata in ZooKeeper.

The driver reads it to resolve ``earliest`` and to find a range that starts below it
before any task runs. Read it before the high-water marks: the log start never passes
the high-water mark + 1, so a start read first is never beyond the end read after.
"""

from __future__ import annotations

from collections.abc import Iterable

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from waltz_client.cluster.metadata import PartitionMetadata
from waltz_client.cluster.paths import ClusterPaths
from waltz_client.cluster.zk import close

from .options import ReadOptions
from .zookeeper import connect_zookeeper


class LogStarts:
    """A ZooKeeper session (opened on first use) that reads partitions' log starts."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._paths = ClusterPaths.of(options.zk_root)
        self._zk: KazooClient | None = None

    def connect(self) -> KazooClient:
        """The session, opened if need be: a ClusterError naming the options when
        ZooKeeper does not answer within requestTimeout (the driver connects here
        first, so a dead ensemble fails the query that soon)."""
        if self._zk is None:
            self._zk = connect_zookeeper(self.options)
        return self._zk

    def read(self, partitions: Iterable[int]) -> dict[int, int]:
        """partition -> its log start (0 for a partition without metadata yet)."""
        zk = self.connect()
        # All the reads under way at once: one round trip however many partitions.
        pending = {p: zk.get_async(self._paths.partition(p)) for p in partitions}
        starts = {}
        for p, answer in pending.items():
            try:
                data, _ = answer.get(timeout=self.options.request_timeout)
            except NoNodeError:
                starts[p] = 0
            else:
                starts[p] = PartitionMetadata.decode(data).log_start
        return starts

    def close(self) -> None:
        if self._zk is not None:
            zk, self._zk = self._zk, None
            close(zk)

    def __enter__(self) -> LogStarts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
