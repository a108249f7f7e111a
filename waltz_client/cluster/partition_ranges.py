"""Partition sets written as ranges: ``0-6,9`` is {0, 1, 2, 3, 4, 5, 6, 9}."""

from __future__ import annotations

MAX_PARTITION_ID = 1_000_000


def parse_partition_ranges(text: str, num_partitions: int | None = None) -> set[int]:
    """Parse ``all`` or comma-separated IDs and inclusive ranges; ValueError says what is wrong."""
    text = text.strip()
    if text == "all":
        if num_partitions is None:
            raise ValueError("'all' needs the number of partitions")
        return set(range(num_partitions))
    result: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            raise ValueError(f"empty item in partition list {text!r}")
        low_text, sep, high_text = part.partition("-")
        try:
            low = int(low_text)
            high = int(high_text) if sep else low
        except ValueError:
            raise ValueError(f"{part!r} is not a partition ID or a range like 0-6") from None
        if low < 0 or high < low:
            raise ValueError(f"{part!r} is not a valid range (IDs are >= 0, low <= high)")
        if num_partitions is None and high >= MAX_PARTITION_ID:
            raise ValueError(f"partition {high} is beyond the largest ID {MAX_PARTITION_ID - 1}")
        if num_partitions is not None and high >= num_partitions:
            raise ValueError(f"partition {high} is outside 0..{num_partitions - 1}")
        result.update(range(low, high + 1))
    return result


def format_partition_ranges(partitions: set[int] | list[int]) -> str:
    """The shortest range text for a set of IDs: {0, 1, 2, 5} -> ``0-2,5``."""
    ids = sorted(set(partitions))
    items: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        items.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(items)
