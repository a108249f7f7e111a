"""An application's ``TransactionBuilder`` as the Append a server takes, and why a server
would refuse one outright. Pure: the client's shell and the simulator send what this
builds."""

from __future__ import annotations

from .transaction import Lock, TransactionBuilder
from .wire.client_messages import MAX_LOCKS, AppendRequest
from .wire.records import DEFAULT_MAX_DATA_BYTES, ReqId


def size_problem(builder: TransactionBuilder) -> str:
    """Why the server would refuse this append outright (it closes the connection); ""
    when it would take it."""
    if len(builder.data) > DEFAULT_MAX_DATA_BYTES:
        return f"transaction data of {len(builder.data)} bytes exceeds {DEFAULT_MAX_DATA_BYTES}"
    for kind, locks in (
        ("write_locks", builder.write_locks),
        ("read_locks", builder.read_locks),
        ("append_locks", builder.append_locks),
    ):
        if len(locks) > MAX_LOCKS:
            return f"{len(locks)} {kind} exceed {MAX_LOCKS}"
    return ""


def _hashes(locks: list[Lock]) -> tuple[int, ...]:
    return tuple(lock.hash32() for lock in locks) if locks else ()


def append_request(req_id: ReqId, builder: TransactionBuilder) -> AppendRequest:
    return AppendRequest(
        req_id,
        builder.client_high_water_mark,
        _hashes(builder.write_locks),
        _hashes(builder.read_locks),
        _hashes(builder.append_locks),
        builder.header,
        builder.data,
    )
