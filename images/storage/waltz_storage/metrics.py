"""Prometheus metrics of a storage node, in a registry of its own (one per node object)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

FSYNC_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)


class ScrapedPartition(Protocol):
    """What a scrape reads of a partition (``PartitionService``)."""

    @property
    def partition_id(self) -> int: ...

    def snapshot(self) -> Mapping[str, float]:
        """The partition's gauges and counters by name (``_PartitionCollector`` lists the
        names)."""
        ...


class StorageMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        # process_*: CPU, resident memory, open files and their limit (/proc/self).
        ProcessCollector(registry=r)
        self.fsync_seconds = Histogram(
            "waltz_storage_fsync_seconds",
            "Latency of one group commit's own fsync",
            ["partition"],
            buckets=FSYNC_BUCKETS,
            registry=r,
        )
        self.group_sync_seconds = Histogram(
            "waltz_storage_group_sync_seconds",
            "Latency of one sync that made several partitions' appends durable at once, "
            "by method (write_back: pages written back and one fdatasync; syncfs)",
            ["method"],
            buckets=FSYNC_BUCKETS,
            registry=r,
        )
        self.requests = Counter(
            "waltz_storage_requests", "Requests handled, by type", ["type"], registry=r
        )
        self.errors = Counter(
            "waltz_storage_errors",
            "Failure responses and closed connections, by error type",
            ["error"],
            registry=r,
        )
        self.connections = Counter("waltz_storage_connections", "Connections accepted", registry=r)
        self.queued_bytes = Gauge(
            "waltz_storage_queued_bytes",
            "Requests queued on all connections, reads counted as their largest reply "
            "(node_queue_max_bytes bounds it)",
            registry=r,
        )
        self.session_checks = Counter(
            "waltz_storage_session_checks",
            "Reads of a partition's metadata in ZooKeeper to check a newer store session, "
            "by result (recorded, not_recorded, failed)",
            ["result"],
            registry=r,
        )
        self.session_refusals_remembered = Counter(
            "waltz_storage_session_refusals_remembered",
            "Newer store sessions refused on a recent read's word, without reading ZooKeeper",
            registry=r,
        )
        self.retention_deleted_bytes = Counter(
            "waltz_storage_retention_deleted_bytes",
            "Bytes of segments deleted below the partition's log start (retention)",
            ["partition"],
            registry=r,
        )

    def watch_partitions(self, source: Callable[[], Iterable[ScrapedPartition]]) -> None:
        self.registry.register(_PartitionCollector(source))

    def watch_disk(self, directory: str) -> None:
        self.registry.register(_DiskCollector(directory))


class PublishingLock:
    """A lock that publishes its holder's state on release, for readers that must not wait.

    ``read`` runs while the lock is still held, at the end of every ``with`` block (and
    once at construction), and its result becomes ``published``: an immutable mapping
    that a scrape reads without the lock. A partition holds its lock across fsync (which
    can take seconds on a slow disk); a scrape that waited for it would stall the event
    loop, and with it every partition and ``/healthz``. Whatever changes under the lock
    is published when the lock is released; nothing else is needed.
    """

    __slots__ = ("_lock", "_read", "published")

    def __init__(self, read: Callable[[], dict[str, float]]) -> None:
        self._lock = threading.Lock()
        self._read = read
        self.published: Mapping[str, float] = MappingProxyType(read())

    def __enter__(self) -> PublishingLock:
        self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.published = MappingProxyType(self._read())
        finally:
            self._lock.release()


class _DiskCollector(Collector):
    """The filesystem of the storage directory, read at scrape time (statvfs: no I/O
    that could block behind a slow fsync)."""

    def __init__(self, directory: str) -> None:
        self._directory = directory

    def collect(self):
        try:
            st = os.statvfs(self._directory)
        except OSError:
            return
        free = GaugeMetricFamily(
            "waltz_storage_disk_free_bytes",
            "Bytes available to the storage node on its data directory's filesystem",
        )
        free.add_metric([], st.f_bavail * st.f_frsize)
        total = GaugeMetricFamily(
            "waltz_storage_disk_size_bytes", "Size of the data directory's filesystem"
        )
        total.add_metric([], st.f_blocks * st.f_frsize)
        yield free
        yield total


class _PartitionCollector(Collector):
    """Per-partition state, read at scrape time."""

    def __init__(self, source: Callable[[], Iterable[ScrapedPartition]]) -> None:
        self._source = source

    def collect(self):
        families = {
            "max_transaction_id": "Highest transaction ID stored (-1 when empty)",
            "low_water_mark": "Low-water mark set by the last store session",
            "local_low_water_mark": "Local low-water mark set by the last store session",
            "session_id": "Highest store session ID seen (requests of older ones are refused)",
            "available": "1 when the partition serves requests, 0 when it failed to open or sync",
            "size_bytes": "Bytes of segment files",
            "log_start": "First transaction served (retention deleted the segments below)",
            "out_of_space": "1 while appends find no space on the disk (they resume by "
            "themselves once there is)",
            "needs_restart": "1 after an fsync failed: only a restart makes the partition "
            "serve again",
        }
        metrics: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            name: GaugeMetricFamily(f"waltz_storage_partition_{name}", doc, labels=["partition"])
            for name, doc in families.items()
        }
        # Counted by the partition since the node opened it (a series starts again at 0
        # when it is opened again, as a counter does when its process restarts).
        counters = {
            "appended_records": "Records appended and fsync'd",
            "appended_bytes": "Transaction data bytes appended and fsync'd",
            "fsyncs": "Group commits of segment data (its own fsync, or a sync shared with others)",
        }
        for name, doc in counters.items():
            metrics[name] = CounterMetricFamily(f"waltz_storage_{name}", doc, labels=["partition"])
        for svc in self._source():
            label = [str(svc.partition_id)]
            state = svc.snapshot()
            for name, metric in metrics.items():
                metric.add_metric(label, state[name])
        yield from metrics.values()
