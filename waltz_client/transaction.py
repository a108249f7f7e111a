"""What an application writes and reads: locks, transaction contexts and builders, and
committed transactions with lazily fetched data."""

from __future__ import annotations

import asyncio
import datetime
import zlib
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from .wire.records import ReqId


@dataclass(frozen=True)
class Lock:
    """An application-defined lock ID: a name and a number (an account, a row...)."""

    name: str
    id: int

    def hash32(self) -> int:
        """The signed 32-bit hash the server's lock table is indexed by."""
        raw = self.name.encode("utf-8") + (self.id & (2**64 - 1)).to_bytes(8, "big")
        h = zlib.crc32(raw)
        return h - 2**32 if h >= 2**31 else h


_BYTES_LIKE = (bytes, bytearray, memoryview)
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


class Serializer(Protocol):
    def serialize(self, value: Any) -> bytes: ...

    def deserialize(self, data: bytes) -> Any: ...


class TransactionBuilder:
    """Handed to ``TransactionContext.execute``: set the header, the data and the locks."""

    def __init__(self, partition_id: int, client_high_water_mark: int) -> None:
        self.partition_id = partition_id
        self.client_high_water_mark = client_high_water_mark
        self.header = 0
        self.data = b""
        self.write_locks: list[Lock] = []
        self.read_locks: list[Lock] = []
        self.append_locks: list[Lock] = []

    def set_header(self, header: int) -> None:
        if not isinstance(header, int) or isinstance(header, bool):
            raise TypeError(f"the header is a 32-bit integer, got {header!r}")
        if not -(2**31) <= header < 2**31:
            raise ValueError(f"the header is a 32-bit integer, got {header}")
        self.header = header

    def set_data(self, data: bytes | Any, serializer: Serializer | None = None) -> None:
        if serializer is not None:
            data = serializer.serialize(data)
        if type(data) is bytes:  # the common case, without a copy
            self.data = data
            return
        if not isinstance(data, _BYTES_LIKE):
            raise TypeError(
                f"transaction data must be bytes (or pass a serializer), got {type(data).__name__}"
            )
        self.data = bytes(data)

    def set_write_locks(self, *locks: Lock) -> None:
        """Checked against the client high-water mark and taken: conflicting writers fail."""
        self.write_locks = list(locks)

    def set_read_locks(self, *locks: Lock) -> None:
        """Checked but not taken: fails if a writer took the lock since this client's
        high-water mark."""
        self.read_locks = list(locks)

    def set_append_locks(self, *locks: Lock) -> None:
        """Taken but not checked: makes readers of the lock fail, never fails itself."""
        self.append_locks = list(locks)


class TransactionContext(ABC):
    """Subclass it: ``partition_id`` picks the partition, ``execute`` builds the
    transaction (it may run several times, against newer states, until it commits or
    returns False to give up). The hooks are optional."""

    max_retries: int | None = None  # None: the client's setting
    # Seconds from submit() until it expires unless committed; None: the client's
    # transaction_timeout.
    timeout: float | None = None

    def partition_id(self, num_partitions: int) -> int:
        return 0

    @abstractmethod
    def execute(self, builder: TransactionBuilder) -> bool:
        """Build the transaction; False gives up (nothing is appended)."""

    def on_completion(self, committed: bool) -> None:
        """The submission ended without failing or expiring: True when it committed (and
        this client applied it), False when ``execute`` returned False (ignored). After it,
        nothing is retried."""
        return None  # optional hook

    def on_expiration(self) -> None:
        """The submission's deadline (``timeout``) passed before it committed; nothing of
        it is in the log, and nothing is retried."""
        return None  # optional hook

    def on_lock_failure(self, transaction_id: int) -> None:
        """A lock was taken by ``transaction_id`` after this attempt's high-water mark; the
        context runs again once the client has applied it."""
        return None  # optional hook

    def on_exception(self, error: BaseException) -> None:
        """The submission failed (``SubmitStatus.FAILED``) with ``error``: what ``execute``
        or the application's high-water mark raised, the refusal, or a
        ``SubmissionFailed`` naming the reason (retries exhausted, cancelled, the client
        closed). Nothing is retried after it."""
        return None  # optional hook


@dataclass
class Transaction:
    """A committed transaction as the feed delivers it; the data is fetched on first use.

    ``timestamp``: its commit time in milliseconds since the Unix epoch, assigned by the
    partition's owner with its ID (never decreasing within a partition); None when the
    transaction has none (written before commit times, or delivered by a server too old
    to send them)."""

    transaction_id: int
    partition_id: int
    header: int
    req_id: ReqId
    _fetch: Callable[[], Awaitable[bytes]] = field(repr=False)
    _fetch_blocking: Callable[[], bytes] = field(repr=False)
    timestamp: int | None = None
    _data: bytes | None = field(default=None, repr=False)
    _fetching: asyncio.Future[bytes] | None = field(default=None, repr=False)

    @property
    def commit_time(self) -> datetime.datetime | None:
        """``timestamp`` as a timezone-aware UTC datetime (None where it is None)."""
        if self.timestamp is None:
            return None
        return _EPOCH + datetime.timedelta(milliseconds=self.timestamp)  # exact, unlike floats

    async def data(self) -> bytes:
        if self._data is None:
            if self._fetching is None:  # concurrent first calls share one fetch
                self._fetching = asyncio.ensure_future(self._fetch())
            try:
                self._data = await asyncio.shield(self._fetching)
            except BaseException:
                self._fetching = None
                raise
        return self._data

    def data_blocking(self) -> bytes:
        """For synchronous callbacks (they run on a worker thread, not the event loop)."""
        if self._data is None:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                pass  # a worker thread: fine
            else:
                raise RuntimeError(
                    "data_blocking() on the event loop would wait forever: "
                    "use `await transaction.data()` in async callbacks"
                )
            self._data = self._fetch_blocking()
        return self._data

    def deserialize(self, serializer: Serializer) -> Any:
        return serializer.deserialize(self.data_blocking())
