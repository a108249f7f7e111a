"""When a store session may shrink what a partition holds on this node: its local
low-water mark (SetLowWaterMark), the end of its log (Truncate), or the start of its log
(SetLogStart).

- The local low-water mark is the floor of what this replica acknowledged as committed:
  it never goes down, and no truncate goes below it.
- A store session truncates only before it appends: no Truncate that drops anything in
  a session that appended here, or that was current when the node opened (a session
  never continues on a replica it lost its connection to). ``no_truncate_through`` is
  the newest such session; sessions at or below it may not truncate.
- The log start moves up only as far as the cluster metadata records it (a server
  records it there before deleting anything), so no peer can wipe a partition's history;
  and past the end of the log (a skip ahead, which empties the log) only for a session
  that did not append here.

Pure: each rule takes the partition's state and says why the request is refused, or
None; ``PartitionService`` reads the state, and writes the control file and the log.
"""

from __future__ import annotations


def local_low_water_mark(mark: int, max_txid: int) -> int:
    """The local low-water mark a SetLowWaterMark of ``mark`` sets: no higher than the
    log on this node reaches."""
    return min(mark, max_txid)


def low_water_mark_refusal(partition_id: int, session: int, local: int, current: int) -> str | None:
    """Why ``session`` may not set the local low-water mark ``local`` over ``current``."""
    if local < current:
        return (
            f"partition {partition_id}: session {session} would lower the local "
            f"low-water mark from {current} to {local}; "
            f"the committed prefix never shrinks"
        )
    return None


def truncate_refusal(
    partition_id: int,
    session: int,
    txid: int,
    *,
    max_txid: int,
    local_low_water_mark: int,
    no_truncate_through: int,
) -> str | None:
    """Why ``session`` may not drop the transactions after ``txid``."""
    if txid < local_low_water_mark:
        return (
            f"partition {partition_id}: truncating to {txid} would drop "
            f"transactions up to the local low-water mark {local_low_water_mark}, which are "
            f"committed"
        )
    if txid < max_txid and session <= no_truncate_through:
        return (
            f"partition {partition_id}: session {session} may not truncate here: "
            f"it appended to this replica, or was current when the node started "
            f"(a store session truncates only before it appends)"
        )
    return None


def log_start_refusal(
    partition_id: int,
    session: int,
    log_start: int,
    *,
    max_txid: int,
    recorded: int | None,
    no_truncate_through: int,
) -> str | None:
    """Why ``session`` may not move the log start up to ``log_start``. ``recorded``: the
    log start the cluster metadata records (None: not checked, no metadata followed)."""
    if recorded is not None and log_start > recorded:
        return (
            f"partition {partition_id}: log start {log_start} is beyond the one the cluster "
            f"metadata records ({recorded}); a server records the log start before moving it"
        )
    if log_start > max_txid + 1 and session <= no_truncate_through:
        return (
            f"partition {partition_id}: session {session} may not skip this "
            f"replica ahead to {log_start}: it appended here"
        )
    return None


def unchecked_log_start(partition_id: int, log_start: int, error: Exception) -> str:
    """The refusal of a log start the cluster metadata could not be read for."""
    return (
        f"partition {partition_id}: cannot check log start {log_start} against the cluster "
        f"metadata ({type(error).__name__}: {error}); retry"
    )
