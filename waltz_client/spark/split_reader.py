"""Reading one split (a range of one partition) as Arrow record batches, on an executor."""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
from collections.abc import Iterator

import pyarrow as pa

from waltz_client.blocking import BlockingWaltzClient
from waltz_client.client import MissingTransactions, WaltzError
from waltz_client.config import WaltzClientConfig
from waltz_client.wire.records import UncheckedRecords

from .arrow import checked_to_arrow
from .options import ReadOptions, WriteOptions
from .planning import Split
from .zookeeper import reaching_zookeeper

log = logging.getLogger(__name__)


def client_config(options: ReadOptions | WriteOptions) -> WaltzClientConfig:
    """A client that reads and writes but mounts nothing: no feed to apply."""
    return WaltzClientConfig(
        zookeeper=options.zookeeper,
        zk_root=options.zk_root,
        request_timeout=options.request_timeout,
        # Executors wait for ZooKeeper as the driver does: requestTimeout.
        zk_connect_timeout=options.request_timeout,
        feed=False,
        tls=options.tls,
        zk_tls=options.zk_tls,
    )


def open_client(options: ReadOptions | WriteOptions) -> BlockingWaltzClient:
    """A started client (``client_config``), kazoo's retry noise kept out of stderr
    while it connects, and an error that names the options when it cannot."""
    return reaching_zookeeper(options, lambda: BlockingWaltzClient(client_config(options)))


_clients: dict[tuple, BlockingWaltzClient] = {}
_clients_lock = threading.Lock()


def shared_client(options: ReadOptions) -> BlockingWaltzClient:
    """One client per cluster for the whole Python worker: Spark reuses its workers, and
    a client costs a ZooKeeper session and a connection to each server to set up."""
    key = (
        options.zookeeper,
        options.zk_root,
        options.request_timeout,
        options.tls,
        options.zk_tls,
    )
    with _clients_lock:
        client = _clients.get(key)
        if client is None or client.client.closed:
            client = open_client(options)
            _clients[key] = client
        return client


@atexit.register
def _close_clients() -> None:
    with _clients_lock:
        for client in _clients.values():
            with contextlib.suppress(Exception):  # the interpreter is going
                client.close()
        _clients.clear()


def read_split(
    options: ReadOptions, split: Split, client: BlockingWaltzClient | None = None
) -> Iterator[pa.RecordBatch]:
    """The split's transactions in order, a range-read response at a time. Transactions
    gone from the log (below the retention mark) fail the read, or with
    ``failOnDataLoss=false`` are skipped and logged."""
    if not len(split):
        return
    if client is None:
        client = shared_client(options)
    start = split.start
    while start < split.end:
        try:
            for batch in client.read_batches(
                split.partition,
                start,
                split.end - 1,
                batch_records=min(options.fetch_records, split.end - start),
                batch_bytes=options.fetch_bytes,
                in_flight=options.fetch_in_flight,
                checked=False,  # checked as they are converted
            ):
                assert isinstance(batch, UncheckedRecords)
                yield checked_to_arrow(split.partition, batch)
                start = batch.first_txid + len(batch)
        except MissingTransactions as e:
            resume = skip_lost(options, split.partition, start, e.first_available, split.end, e)
            if resume <= start:  # the log start did not move past us: not a gap after all
                raise
            start = resume
        else:
            return


def skip_lost(
    options: ReadOptions,
    partition: int,
    start: int,
    first_available: int,
    end: int,
    cause: MissingTransactions | None = None,
) -> int:
    """Where a read of ``partition`` from ``start`` to ``end`` (exclusive) goes on when
    the log now starts at ``first_available``: ``start`` if nothing it wants is gone;
    else, with failOnDataLoss (the default), an error naming the first available ID;
    without it, the first available ID (or ``end``), having logged how many it skips."""
    resume = min(first_available, end)
    if resume <= start:
        return start
    if options.fail_on_data_loss:
        raise WaltzError(
            f"{MissingTransactions(partition, start, first_available)}; set the option "
            "failOnDataLoss=false to skip what is gone"
        ) from cause
    log.warning(
        "partition %d: skipped %d transactions (%d..%d) no longer in the log "
        "(failOnDataLoss=false); the first available is %d",
        partition,
        resume - start,
        start,
        resume - 1,
        first_available,
    )
    return resume
