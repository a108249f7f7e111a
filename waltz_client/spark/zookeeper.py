"""Reaching the cluster's ZooKeeper from the source: within ``requestTimeout``, and
quietly.

kazoo logs each failed connection attempt (``Connection dropped: ... Connection
refused``, then ``Failed connecting to Zookeeper within the connection retry policy``)
at WARNING and ERROR, and a Spark driver's Python processes have no logging set up, so
Python's last-resort handler copied every one of them to the driver's stderr. While
the source connects, those records are demoted to DEBUG (a handler set to DEBUG still
sees them) and counted; the outcome is said once: in the error when ZooKeeper never
answers, or in one INFO line when it answered after failed attempts. Once connected,
a client that loses ZooKeeper logs the first failed attempt of the outage at kazoo's
level and the rest at DEBUG (in every process that imports the source: the driver's
and Spark's Python workers).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

from kazoo.client import KazooClient

from waltz_client.cluster.errors import ClusterError
from waltz_client.cluster.partition_ranges import format_partition_ranges
from waltz_client.cluster.zk import connect

from .options import ReadOptions, WriteOptions

log = logging.getLogger(__name__)

T = TypeVar("T")

# The logger waltz_client.cluster.zk.connect gives every KazooClient (and kazoo's own).
_KAZOO = logging.getLogger("kazoo.client")
_GAVE_UP = "Failed connecting to Zookeeper"


_RETRYING = ("Connection dropped", _GAVE_UP)
_CONNECTED = "Zookeeper connection established"


class _OncePerOutage(logging.Filter):
    """A client whose ZooKeeper is gone (an outage, or a cluster stopped under a
    Python worker that keeps its client for the next task) retries for good, and
    kazoo logs every attempt. The first of an outage keeps its level; the rest, until
    that client connects again, are DEBUG. A client is its kazoo connection thread."""

    def __init__(self) -> None:
        super().__init__()
        self._down: set[tuple[int | None, str | None]] = set()
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        client = (record.thread, record.threadName)
        if record.levelno >= logging.WARNING and str(record.msg).startswith(_RETRYING):
            with self._lock:
                repeat = client in self._down
                self._down.add(client)
            if repeat:
                record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        elif str(record.msg).startswith(_CONNECTED):
            with self._lock:
                self._down.discard(client)
        return True


_once_per_outage = _OncePerOutage()
if not any(isinstance(f, _OncePerOutage) for f in _KAZOO.filters):
    _KAZOO.addFilter(_once_per_outage)


class _Demote(logging.Filter):
    """Demotes kazoo's WARNING and ERROR records to DEBUG, counting the failed
    attempts and remembering the last one's reason."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.last = ""
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            message = record.getMessage()
            with self._lock:
                if message.startswith(_GAVE_UP):  # kazoo's summary, not an attempt
                    self.last = self.last or message
                else:
                    self.count += 1
                    self.last = message
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


@contextlib.contextmanager
def quiet_kazoo() -> Iterator[_Demote]:
    """kazoo's connection warnings demoted to DEBUG while the block runs (the filter
    is on kazoo's logger, so it applies to every kazoo client of the process, for
    that long)."""
    demote = _Demote()
    _KAZOO.addFilter(demote)
    try:
        yield demote
    finally:
        _KAZOO.removeFilter(demote)


def describe(options: ReadOptions | WriteOptions) -> str:
    """``WaltzSource[zookeeper=zk:2181, root=/waltz, partitions=0-3]``: the source in
    messages (Spark's progress reports cannot show it: see docs/spark.md)."""
    parts = [f"zookeeper={options.zookeeper}", f"root={options.zk_root}"]
    if isinstance(options, ReadOptions):
        chosen = options.partitions
        parts.append(
            f"partitions={'all' if chosen is None else format_partition_ranges(set(chosen))}"
        )
        return f"WaltzSource[{', '.join(parts)}]"
    return f"WaltzSink[{', '.join(parts)}]"


def reaching_zookeeper(options: ReadOptions | WriteOptions, make: Callable[[], T]) -> T:
    """``make()`` (something that connects to the cluster's ZooKeeper) with kazoo's
    retry noise demoted, and a ClusterError that names the options to look at."""
    with quiet_kazoo() as demoted:
        try:
            made = make()
        except ClusterError as e:
            tried = ""
            if demoted.count:
                tried = f"; {demoted.count} failed attempts, the last: {demoted.last}"
            raise ClusterError(
                f"{describe(options)}: {e} (the options zookeeper and requestTimeout{tried})"
            ) from None
    if demoted.count:
        log.info(
            "ZooKeeper at %s answered after %d failed attempts (the last: %s)",
            options.zookeeper,
            demoted.count,
            demoted.last,
        )
    return made


def connect_zookeeper(options: ReadOptions | WriteOptions) -> KazooClient:
    """A ZooKeeper session with the cluster's ensemble, or a ClusterError once
    ``requestTimeout`` has passed without an answer."""
    return reaching_zookeeper(
        options,
        lambda: connect(options.zookeeper, timeout=options.request_timeout, tls=options.zk_tls),
    )
