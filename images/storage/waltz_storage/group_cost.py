"""``waltz storage bench-group``: what a group of appends costs a storage node's I/O thread,
by the partitions in it.

A node runs each group of requests on its I/O thread (``StorageNode.process_in_order``):
every partition's append written to its segment, the group made durable with one sync,
each append answered. With many partitions and few records each (a server with many
partitions under a modest load), the work a partition's append costs, not a record's,
sets the node's rate. This opens a node in-process on ``--dir`` (its real code, no
sockets), runs ``groups`` groups of one ``records``-record append to every partition,
and reports the thread's own CPU a request, split into user (the node's Python) and
system (the kernel's writes and syncs, ``getrusage(RUSAGE_THREAD)``), and the wall
time a group. Client, network and event loop are left out: ``waltz storage bench``
measures the node whole.
"""

from __future__ import annotations

import os
import resource
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass

from waltz_client.wire.records import Record, RecordBatch, ReqId
from waltz_client.wire.storage_messages import AppendRequest, StorageMessage, SuccessResponse

from .engine_settings import EngineSettings
from .partition_service import PartitionService
from .service import StorageNode

HEADER = (
    "| partitions a group | records an append | user us a request | system us a request "
    "| wall ms a group |\n| ---: | ---: | ---: | ---: | ---: |"
)
_TIME_MS = 1_767_225_600_000  # the records' commit times count up from it
_SESSION = 1


@dataclass(frozen=True)
class GroupCost:
    partitions: int
    records: int
    groups: int
    user_us: float  # the I/O thread's user CPU a request
    system_us: float  # its system CPU a request
    group_ms: float  # wall time a group


def _group(
    services: list[PartitionService], number: int, records: int, data: bytes
) -> list[tuple[PartitionService, StorageMessage]]:
    """Group ``number`` (from 0): one append of ``records`` records to every partition."""
    first = number * records
    batch = RecordBatch.from_records(
        [Record(t, ReqId(1, 1, 0, t), 0, data, _TIME_MS + t) for t in range(first, first + records)]
    )
    return [
        (service, AppendRequest(_SESSION, number, service.partition_id, batch))
        for service in services
    ]


def measure(
    directory: str, partitions: int, records: int, record_bytes: int, groups: int
) -> GroupCost:
    """``groups`` groups over a node of ``partitions`` partitions in a new directory under
    ``directory`` (removed after); RuntimeError if an append is not acknowledged."""
    where = tempfile.mkdtemp(prefix="waltz-bench-group-", dir=directory)
    try:
        node = StorageNode.open(
            where, uuid.uuid4(), partitions, set(range(partitions)), EngineSettings()
        )
        try:
            services = [node.partitions[p] for p in range(partitions)]
            data = os.urandom(record_bytes)
            # Built first, so that only the node's work is timed; the first group adopts
            # the session (a control-file write) and is not counted.
            batches = [_group(services, n, records, data) for n in range(groups + 1)]
            _check(node.process_in_order(batches[0]))
            before = resource.getrusage(resource.RUSAGE_THREAD)
            started = time.perf_counter()
            for group in batches[1:]:
                _check(node.process_in_order(group))
            elapsed = time.perf_counter() - started
            after = resource.getrusage(resource.RUSAGE_THREAD)
        finally:
            node.close()
    finally:
        shutil.rmtree(where, ignore_errors=True)
    requests = groups * partitions
    return GroupCost(
        partitions=partitions,
        records=records,
        groups=groups,
        user_us=1e6 * (after.ru_utime - before.ru_utime) / requests,
        system_us=1e6 * (after.ru_stime - before.ru_stime) / requests,
        group_ms=1e3 * elapsed / groups,
    )


def _check(responses: list[StorageMessage]) -> None:
    for response in responses:
        if not isinstance(response, SuccessResponse):
            raise RuntimeError(f"an append was not acknowledged: {response}")


def describe(cost: GroupCost) -> str:
    return (
        f"| {cost.partitions} | {cost.records} | {cost.user_us:.1f} | {cost.system_us:.1f} "
        f"| {cost.group_ms:.3f} |"
    )
