"""A simulated storage node: the real request handling over an in-memory disk.

Requests are decided by the storage daemon's own ``PartitionService`` (fencing, the
low-water marks, truncation floors, contiguity, reads); only the files are replaced by
``MemoryLog`` and ``MemoryControl``. As in the daemon, one worker takes what every
connection queued as a group (``process_group``); the group becomes durable, and is
answered, a random "fsync" delay later, while the next gathers. A crash before that
loses the group, as a crash loses an unsynced tail. Truncations and control-state
writes are durable at once, as on disk.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import replace

from sim_net import SimNetwork

from waltz_client.wire.errors import ProtocolError
from waltz_client.wire.framing import (
    HANDSHAKE_BYTES,
    FrameDecoder,
    Hello,
    Service,
    negotiate,
)
from waltz_client.wire.records import DEFAULT_FORMAT, RecordBatch, RecordHeader, ReqId
from waltz_client.wire.storage_messages import (
    DEFAULT_LIMITS,
    STORAGE_PROTOCOL_VERSIONS,
    AppendRequest,
    FailureResponse,
    OpenRequest,
    StorageError,
    StorageMessage,
    SuccessResponse,
    decode_request,
)
from waltz_storage.control_file import PartitionInfo
from waltz_storage.errors import NonContiguousAppend, TruncateRefused
from waltz_storage.group_sync import GroupSync
from waltz_storage.metrics import StorageMetrics
from waltz_storage.service import EngineSettings, PartitionService, process_in_order


class MemoryLog:
    """The part of ``PartitionLog`` that ``PartitionService`` uses, in memory."""

    directory = "(memory)"
    log_start = 0  # the simulator runs no retention

    def __init__(self, partition_id: int) -> None:
        self.partition_id = partition_id
        # (txid, wire record, data length, its request, its commit time: what the
        # simulator compares)
        self.records: list[tuple[int, bytes, int, ReqId, int]] = []

    @property
    def max_txid(self) -> int:
        return self.records[-1][0] if self.records else -1

    @property
    def size_bytes(self) -> int:
        return sum(len(r[1]) for r in self.records)

    def append(self, batch: RecordBatch) -> None:
        batch = batch.convert(DEFAULT_FORMAT)  # as the real node stores them
        expected = self.max_txid + 1
        for i, (txid, _, _) in enumerate(batch.spans):
            if txid != expected + i:
                raise NonContiguousAppend(f"expected transaction {expected + i}, got {txid}")
        ends = [pos for _, pos, _ in batch.spans[1:]] + [len(batch.buf)]
        for (txid, pos, length), end in zip(batch.spans, ends, strict=True):
            _, client, generation, partition, seq, _, _, timestamp = (
                DEFAULT_FORMAT.head.unpack_from(batch.buf, pos)
            )
            req_id = ReqId(client, generation, partition, seq)
            self.records.append((txid, batch.buf[pos:end], length, req_id, timestamp))

    def sync(self, sync_data: object = None) -> None:
        pass  # durability is modelled by when the node applies an append

    def truncate(self, txid: int) -> None:
        if txid < -1:
            raise TruncateRefused(f"cannot truncate to {txid}")
        del self.records[txid + 1 :]

    def read(self, txid: int, max_records: int, max_bytes: int) -> RecordBatch:
        if txid > self.max_txid or txid < 0 or max_records <= 0:
            return RecordBatch(b"", [])
        chosen = self.records[txid : txid + max_records]
        parts, spans, pos = [], [], 0
        for t, wire, length, _, _ in chosen:
            if spans and pos + len(wire) > max_bytes:
                break
            spans.append((t, pos, length))
            parts.append(wire)
            pos += len(wire)
        return RecordBatch(b"".join(parts), spans)

    def read_headers(self, txid: int, max_records: int, max_bytes: int) -> list[RecordHeader]:
        return list(self.read(txid, max_records, max_bytes).headers())

    def close(self) -> None:
        pass


class MemoryControl:
    def __init__(self) -> None:
        self.infos: dict[int, PartitionInfo] = {}

    def write_partition(
        self, partition_id: int, info: PartitionInfo, *, sync: bool = True
    ) -> PartitionInfo:
        # Durable at once, synced or not: a group is handled and answered in one step,
        # and a crash loses it whole (the module's docstring).
        info = replace(info, sequence=info.sequence + 1)
        self.infos[partition_id] = info
        return info

    def sync(self) -> None:
        pass


class SimStorageNode:
    def __init__(
        self,
        net: SimNetwork,
        observe: Callable[[SimStorageNode, StorageMessage, StorageMessage], None],
        name: str,
        address: str,
        cluster_key: uuid.UUID,
        partitions: list[int],
        num_partitions: int,
    ) -> None:
        self.net = net
        self.observe = observe
        self.name = name
        self.address = address
        self.cluster_key = cluster_key
        self.num_partitions = num_partitions
        self.control = MemoryControl()
        self.metrics = StorageMetrics()
        self.logs = {p: MemoryLog(p) for p in partitions}
        self.services: dict[int, PartitionService] = {}
        self.up = True
        self.incarnation = 0
        self.group_sync = GroupSync("(memory)", None)  # no syncfs: a commit per partition
        self._queue: list[tuple[_StorageProtocol, StorageMessage]] = []
        self._busy = False
        self._open_services()
        net.listen(name, address, lambda: _StorageProtocol(self))

    def _open_services(self) -> None:
        for p in list(self.services) or list(self.logs):
            self.open_partition(p)

    def holds(self, partition_id: int) -> bool:
        return partition_id in self.services

    def close_partition(self, partition_id: int) -> None:
        """No longer served (its data stays, as files do)."""
        self.services.pop(partition_id, None)

    def open_partition(self, partition_id: int) -> None:
        """Served again (assigned again): from the data it kept, or empty."""
        log_ = self.logs.setdefault(partition_id, MemoryLog(partition_id))
        self.services[partition_id] = PartitionService(
            partition_id,
            self.control,  # type: ignore[arg-type]
            EngineSettings(),
            self.metrics,
            log_,  # type: ignore[arg-type]
            self.control.infos.get(partition_id, PartitionInfo()),
        )

    def wipe(self, partition_id: int) -> None:
        """The disk was replaced: nothing of the partition is left."""
        self.logs[partition_id] = MemoryLog(partition_id)
        self.control.infos.pop(partition_id, None)

    def crash(self) -> None:
        self.up = False
        self.incarnation += 1
        self._queue = []  # requests not yet handled die with the process
        self._busy = False
        self.net.node_down(self.name)

    def restart(self) -> None:
        self._open_services()  # state comes back from the "disk": logs and control infos
        self.up = True
        self.net.node_up(self.name)

    def _answer_at_once(self, request: StorageMessage) -> StorageMessage | None:
        """The answer to an Open, or to a request for a partition not held; else None."""
        if isinstance(request, OpenRequest):
            if request.cluster_key != self.cluster_key:
                return FailureResponse(
                    request.session_id,
                    request.seq,
                    request.partition_id,
                    StorageError.CLUSTER_KEY_MISMATCH,
                    "cluster key mismatch",
                )
            return SuccessResponse(request.session_id, request.seq, request.partition_id)
        if request.partition_id not in self.services:
            return FailureResponse(
                request.session_id,
                request.seq,
                request.partition_id,
                StorageError.PARTITION_NOT_FOUND,
                "not held",
            )
        return None

    # --- the node's worker: one group at a time, as the daemon's NodeWorker -------------

    def enqueue(self, conn: _StorageProtocol, request: StorageMessage) -> None:
        """Queue a request; the node works through its queue a drained group at a time."""
        self._queue.append((conn, request))
        if not self._busy:
            self._busy = True
            asyncio.get_running_loop().call_soon(self._start_group, self.incarnation)

    def _start_group(self, incarnation: int) -> None:
        if incarnation != self.incarnation or not self._queue:
            self._busy = False
            return
        group, self._queue = self._queue, []
        rng = self.net.rng
        appends = any(isinstance(r, AppendRequest) for _, r in group)
        work = rng.uniform(0.0002, 0.003) if appends else 0.0001
        asyncio.get_running_loop().call_later(work, self._finish_group, group, incarnation)

    def _finish_group(
        self, group: list[tuple[_StorageProtocol, StorageMessage]], incarnation: int
    ) -> None:
        if not self.up or self.incarnation != incarnation:
            return  # crashed before the fsync: the group never happened
        # A request that arrived is handled even if its connection has closed since.
        responses: list[StorageMessage | None] = [self._answer_at_once(r) for _, r in group]
        queued = [i for i, response in enumerate(responses) if response is None]
        answered = process_in_order(
            [(self.services[group[i][1].partition_id], group[i][1]) for i in queued],
            self.group_sync,
            self.metrics,
        )
        for i, response in zip(queued, answered, strict=True):
            responses[i] = response
        for (conn, request), response in zip(group, responses, strict=True):
            assert response is not None
            self.observe(self, request, response)
            conn.send(response)
        self._start_group(incarnation)


class _StorageProtocol(asyncio.Protocol):
    """One connection: handshake, then requests answered in order; an Append's answer
    waits for its simulated fsync, and later answers wait behind it."""

    def __init__(self, node: SimStorageNode) -> None:
        self.node = node
        self.transport: asyncio.Transport | None = None
        self._hello = bytearray()
        self._decoder: FrameDecoder | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def connection_lost(self, exc) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        if not self.node.up or self.transport is None:
            return
        if self._decoder is None:
            self._hello += data
            if len(self._hello) < HANDSHAKE_BYTES:
                return
            reply = negotiate(
                Hello.decode(bytes(self._hello[:HANDSHAKE_BYTES])),
                Service.STORAGE,
                STORAGE_PROTOCOL_VERSIONS,
            )
            self.transport.write(reply.encode())
            self._decoder = FrameDecoder(64 * 1024 * 1024)
            rest, self._hello = bytes(self._hello[HANDSHAKE_BYTES:]), bytearray()
            if not rest:
                return
            data = rest
        try:
            for message_type, body in self._decoder.feed(data):
                self._schedule(decode_request(message_type, body, DEFAULT_LIMITS))
        except ProtocolError:
            self.transport.close()

    def _schedule(self, request: StorageMessage) -> None:
        self.node.enqueue(self, request)

    def send(self, response: StorageMessage) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(response.encode())
