"""Offsets and splits: which transactions a batch or a micro-batch reads (pure).

An offset is the next transaction ID to read in a partition: a range is
``start`` inclusive to ``end`` exclusive, as in Spark's Kafka source. The log of a
partition holds IDs ``earliest .. high-water mark``; "latest" is the high-water
mark + 1.
"""

from __future__ import annotations

import datetime
import itertools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from .options import EARLIEST, LATEST, ByTime, OffsetSpec, Position, WaltzOptionError


@dataclass(frozen=True)
class Split:
    """Transactions ``start`` to ``end - 1`` of one partition: one Spark input partition."""

    partition: int
    start: int
    end: int

    def __len__(self) -> int:
        return self.end - self.start


def chosen_partitions(wanted: Iterable[int] | None, num_partitions: int) -> list[int]:
    """The partitions to read; an unknown one is an error that names the option."""
    if wanted is None:
        return list(range(num_partitions))
    missing = sorted(p for p in wanted if p >= num_partitions)
    if missing:
        raise WaltzOptionError(
            f"partitions: {missing} do not exist (the cluster has {num_partitions}: "
            f"0..{num_partitions - 1})"
        )
    return sorted(wanted)


def resolve(
    spec: OffsetSpec,
    name: str,
    partitions: list[int],
    earliest: Mapping[int, int],
    latest: Mapping[int, int],
) -> dict[int, int]:
    """The offset of every chosen partition. A JSON map must name each of them (as
    Kafka's source requires) and no other; -2 and -1 stand for earliest and latest. An
    offset above latest is refused: it would wait for transactions that may never come."""
    if spec == "earliest":
        return {p: earliest[p] for p in partitions}
    if spec == "latest":
        return {p: latest[p] for p in partitions}
    assert isinstance(spec, dict)
    extra = sorted(set(spec) - set(partitions))
    if extra:
        raise WaltzOptionError(
            f"{name}: partitions {extra} are not read (see the partitions option)"
        )
    missing = sorted(set(partitions) - set(spec))
    if missing:
        raise WaltzOptionError(f"{name}: no offset for partitions {missing}")
    result = {}
    for p in partitions:
        value = spec[p]
        if value == EARLIEST:
            value = earliest[p]
        elif value == LATEST:
            value = latest[p]
        elif value > latest[p]:
            raise WaltzOptionError(
                f"{name}: partition {p}: transaction {value} is beyond the end of the log "
                f"(its next transaction is {latest[p]})"
            )
        result[p] = value
    return result


def resolve_by_time(
    spec: ByTime,
    partitions: list[int],
    latest: Mapping[int, int],
    find_time: Callable[[int, int], int],
    *,
    ending: bool,
    strategy: str = "error",
) -> dict[int, int]:
    """The offset of every chosen partition from commit times, one ``find_time(partition,
    time)`` each: the ID of the first transaction committed at or after the time.

    ``latest`` is each partition's high-water mark + 1, read before these calls, so a
    position is never beyond it (a transaction committed since does not count). A start
    is that transaction (inclusive); where there is none, ``strategy`` says: ``error``
    fails, naming the partition and the time, ``latest`` starts at the end. An end is
    exclusive, as endingOffsets: the read stops before the first transaction at or after
    the time, so it reads those committed before it; where there is none, at ``latest``
    (Kafka's source does the same)."""
    if isinstance(spec.times, dict):
        extra = sorted(set(spec.times) - set(partitions))
        if extra:
            raise WaltzOptionError(
                f"{spec.option}: partitions {extra} are not read (see the partitions option)"
            )
        missing = sorted(set(partitions) - set(spec.times))
        if missing:
            raise WaltzOptionError(f"{spec.option}: no time for partitions {missing}")
    result = {}
    for p in partitions:
        time = spec.time_of(p)
        assert time is not None
        found = min(find_time(p, time), latest[p])
        if found >= latest[p] and not ending and strategy == "error":
            raise WaltzOptionError(
                f"{spec.option}: partition {p} has no transaction committed at or after "
                f"{time} ({_utc(time)}; its next transaction is {latest[p]}); set "
                "startingOffsetsByTimestampStrategy=latest to start such a partition at "
                "its end"
            )
        result[p] = found
    return result


def _utc(millis: int) -> str:
    """``2026-11-28T14:15:16.789Z``, or the number where it is no date."""
    try:
        moment = datetime.datetime.fromtimestamp(millis / 1000, datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return f"{millis} ms"
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def option_name(position: Position, ending: bool) -> str:
    """The option a position came from, for messages."""
    if isinstance(position, ByTime):
        return position.option
    return "endingOffsets" if ending else "startingOffsets"


def check_range(
    start: Mapping[int, int],
    end: Mapping[int, int],
    ending: str = "endingOffsets",
    starting: str = "startingOffsets",
) -> None:
    """Refuse an end before its start (``ending``, ``starting``: the options they came
    from)."""
    source = "" if starting == "startingOffsets" else f" (from {starting})"
    for p, s in start.items():
        if end[p] < s:
            raise WaltzOptionError(
                f"{ending}: partition {p} ends at {end[p]}, before its starting offset {s}{source}"
            )


def plan_splits(
    start: Mapping[int, int], end: Mapping[int, int], max_per_split: int
) -> list[Split]:
    """Each partition's range cut into as few splits of at most ``max_per_split``
    transactions as it takes, all of one size (to within one), so no short task is left
    to run alone at the end of a stage; interleaved across partitions so that the first
    tasks read every partition."""
    per_partition = []
    for p in sorted(start):
        first, stop = start[p], end.get(p, start[p])
        total = max(0, stop - first)
        pieces = -(-total // max_per_split)  # ceiling
        bounds = [first + total * i // pieces for i in range(pieces + 1)] if pieces else []
        per_partition.append([Split(p, a, b) for a, b in itertools.pairwise(bounds)])
    splits = []
    for row in range(max((len(r) for r in per_partition), default=0)):
        splits.extend(r[row] for r in per_partition if row < len(r))
    return splits


def limit_offsets(
    start: Mapping[int, int], latest: Mapping[int, int], max_transactions: int
) -> dict[int, int]:
    """The end of a micro-batch that reads at most ``max_transactions``: each partition
    gets a share in proportion to what it has waiting (Kafka's rule); the remainder goes
    to the partitions with the largest backlog, so the batch is never empty when
    something is waiting and a lagging partition is never starved."""
    backlog = {p: max(0, latest[p] - start[p]) for p in start}
    total = sum(backlog.values())
    if total <= max_transactions:
        return {p: max(start[p], latest[p]) for p in start}
    shares = {p: backlog[p] * max_transactions // total for p in start}
    left = max_transactions - sum(shares.values())
    for p in sorted(start, key=lambda q: (-(backlog[q] - shares[q]), q)):
        if left == 0:
            break
        if shares[p] < backlog[p]:
            shares[p] += 1
            left -= 1
    return {p: start[p] + shares[p] for p in start}


def encode_offsets(offsets: Mapping[int, int]) -> dict[str, int]:
    """The streaming offset Spark checkpoints: JSON keys are strings."""
    return {str(p): offsets[p] for p in sorted(offsets)}


def decode_offsets(offset: Mapping[str, int]) -> dict[int, int]:
    try:
        return {int(p): int(t) for p, t in offset.items()}
    except (TypeError, ValueError) as e:
        raise ValueError(f"not a waltz offset (partition -> next transaction): {offset!r}") from e
