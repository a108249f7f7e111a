"""What a client connection's certificate identity may do: which client IDs it may use
(on a client port with mutual TLS), and which partitions it may read or append (the
cluster's access policy, ``waltz_client.cluster.access``).

A client ID is bound to the identity of the first connection that uses it for a Mount,
Append or Flush (recorded in ZooKeeper, first user wins; client IDs are allocated
fresh from ZooKeeper, so a well-behaved client is always its ID's first user). After
that, a connection with another identity that uses the ID is refused: a client cannot
mount or append as another. Bindings are cached here; ZooKeeper holds the truth.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from waltz_client.cluster.access import Access
from waltz_client.wire.client_messages import (
    AppendRequest,
    ClientMessage,
    FlushRequest,
    MountRequest,
    ReadRangeRequest,
    TransactionDataRequest,
)

# Requests that act as a client (reads and feeds are not tied to a client ID).
ACTS_AS_CLIENT = (AppendRequest, MountRequest, FlushRequest)


def required_access(message: ClientMessage) -> Access:
    """The access a request needs: appending, reading data, or (mounts, feeds, high-water
    marks, flushes: what a client needs to learn what committed) either of them."""
    if isinstance(message, AppendRequest):
        return Access.APPEND
    if isinstance(message, (TransactionDataRequest, ReadRangeRequest)):
        return Access.READ
    return Access.FEED


def refusal(identity: str | None, partition_id: int, access: Access) -> str:
    """The FORBIDDEN error's text."""
    who = f"identity {identity!r}" if identity is not None else "a client without a certificate"
    what = {
        Access.APPEND: "append to",
        Access.READ: "read the data of",
        Access.FEED: "mount or follow",
    }[access]
    return f"{who} may not {what} partition {partition_id} (the cluster's access policy)"


class ClientBindings:
    def __init__(self, bind: Callable[[int, str], Awaitable[str]], max_cached: int = 100_000):
        self._bind = bind  # creates or reads the binding in ZooKeeper
        self._cache: dict[int, str] = {}
        self._max_cached = max_cached

    async def bound_identity(self, client_id: int, identity: str) -> str:
        """The identity ``client_id`` belongs to (``identity`` when it claims it now)."""
        known = self._cache.get(client_id)
        if known is None:
            known = await self._bind(client_id, identity)
            if len(self._cache) >= self._max_cached:
                self._cache.pop(next(iter(self._cache)))  # the oldest: ZooKeeper has it
            self._cache[client_id] = known
        return known
