"""The client's two connections to one server: the stream (mounts, appends, the feed,
flushes) and the RPC connection (client IDs, transaction data, high-water marks, range
reads), each opened when first needed and again after it closes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from .runtime.tasks import spawn, wait_for
from .wire.client_messages import ClientMessage
from .wire.framing import OpenConnection
from .wire.records import ReqId
from .wire.server_connection import ServerConnection

log = logging.getLogger(__name__)


class ServerLink:
    def __init__(
        self,
        endpoint: str,
        dialer: Callable[[str], OpenConnection],
        on_stream_message: Callable[[ClientMessage], None],
        on_stream_closed: Callable[[ServerLink, ServerConnection], None],
        next_connection_seq: Callable[[], int],
        max_version: int | None = None,
    ) -> None:
        self.endpoint = endpoint
        self._max_version = max_version  # the newest protocol version offered (None: ours)
        self._dialer = dialer  # asked at each connect: the server's TLS name may change
        self._on_stream_message = on_stream_message
        self._on_stream_closed = on_stream_closed
        self._next_connection_seq = next_connection_seq
        self.stream: ServerConnection | None = None
        self.rpc: ServerConnection | None = None
        self.stream_seq = 0  # orders this client's stream connections (Mount.connection_seq)
        self.rpc_waiters: dict[ReqId, asyncio.Future[ClientMessage]] = {}
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()  # the connections' watchers

    async def stream_connection(self) -> ServerConnection:
        async with self._lock:
            if self.stream is None or self.stream.closed:
                host, _, port = self.endpoint.rpartition(":")
                self.stream = await ServerConnection.connect(
                    host,
                    int(port),
                    on_message=self._on_stream_message,
                    open_connection=self._dialer(self.endpoint),
                    feed_rows=True,  # the partitions' feeds read rows
                    max_version=self._max_version,
                )
                self.stream_seq = self._next_connection_seq()
                conn = self.stream
                spawn(self._watch_stream(conn), self._tasks, "watching a stream connection", log)
            return self.stream

    async def _watch_stream(self, conn: ServerConnection) -> None:
        await conn.closed_event.wait()
        self._on_stream_closed(self, conn)

    async def rpc_connection(self) -> ServerConnection:
        async with self._lock:
            if self.rpc is None or self.rpc.closed:
                host, _, port = self.endpoint.rpartition(":")
                self.rpc = await ServerConnection.connect(
                    host,
                    int(port),
                    on_message=self._on_rpc_message,
                    open_connection=self._dialer(self.endpoint),
                    check_records=False,  # range reads check them, or their callers do
                    max_version=self._max_version,
                )
                conn = self.rpc
                spawn(self._watch_rpc(conn), self._tasks, "watching an RPC connection", log)
            return self.rpc

    async def ask(
        self, conn: ServerConnection, message: ClientMessage, timeout: float
    ) -> ClientMessage:
        """Send an RPC on ``conn`` (this link's RPC connection) and wait for its answer;
        ``TimeoutError``, or ``ConnectionError`` when the connection closes first."""
        future: asyncio.Future[ClientMessage] = asyncio.get_running_loop().create_future()
        self.rpc_waiters[message.req_id] = future
        try:
            conn.send(message)
            return await wait_for(future, timeout)
        finally:
            self.rpc_waiters.pop(message.req_id, None)

    async def _watch_rpc(self, conn: ServerConnection) -> None:
        """A closed RPC connection fails its waiting requests at once (they retry)."""
        await conn.closed_event.wait()
        waiters, self.rpc_waiters = self.rpc_waiters, {}
        for future in waiters.values():
            if not future.done():
                future.set_exception(ConnectionError(conn.closed_reason or "closed"))

    def _on_rpc_message(self, m: ClientMessage) -> None:
        future = self.rpc_waiters.pop(m.req_id, None)
        if future is not None and not future.done():
            future.set_result(m)

    async def close(self) -> None:
        for conn in (self.stream, self.rpc):
            if conn is not None:
                await conn.close()
