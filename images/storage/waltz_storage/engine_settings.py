"""The settings of a storage node's engine, shared by its partitions."""

from __future__ import annotations

from dataclasses import dataclass

from .partition import DEFAULT_MAX_TORN_BYTES, DEFAULT_SEGMENT_BYTES

DEFAULT_MAX_RESPONSE_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class EngineSettings:
    segment_bytes: int = DEFAULT_SEGMENT_BYTES
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    # Bytes a crash can leave unsynced at the end of a log: one write group.
    max_torn_bytes: int = DEFAULT_MAX_TORN_BYTES
    # Partitions syncing at once share one flush (group_sync.py); off: one fsync each.
    group_sync: bool = True
    # On ext2/3/4, by pages written back and one fdatasync; off: one syncfs.
    group_sync_write_back: bool = True
