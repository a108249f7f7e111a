"""``waltz storage bench-sync``: what making a group durable costs, by the files it touched.

A storage node's group commit makes the appends of every partition in the group durable
together. On ext4 it writes back each segment's new pages (``sync_file_range``) and
then runs one ``fdatasync`` (group_sync.py): one write-back a partition. This measures
that against one journal file taking all the group's bytes and one ``fdatasync``: the
design a node-wide journal would have. Both write over zeros made durable first, as
segments are written. It measures the filesystem under ``--dir``, not a storage node.
"""

from __future__ import annotations

import ctypes
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

from .group_sync import (
    SYNC_FILE_RANGE_WAIT_AFTER,
    SYNC_FILE_RANGE_WAIT_BEFORE,
    SYNC_FILE_RANGE_WRITE,
    WriteBack,
    load_write_back,
)

ZEROS = 1 << 20  # written at a time while preallocating


@dataclass(frozen=True)
class SyncCost:
    files: int
    bytes_a_file: int
    rounds: int
    segments_ms: float  # median wall time of a round, one file a partition
    segments_cpu_us: float  # this process's CPU a round
    journal_ms: float
    journal_cpu_us: float


def _zeroed(path: str, size: int) -> int:
    """A file of ``size`` zero bytes, durable; its descriptor."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    zeros = bytes(ZEROS)
    for start in range(0, size, ZEROS):
        os.write(fd, zeros[: min(ZEROS, size - start)])
    os.fsync(fd)
    return fd


def _checked(write_back: WriteBack, fd: int, offset: int, nbytes: int, flags: int) -> None:
    if write_back(fd, offset, nbytes, flags) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"sync_file_range: {os.strerror(errno)}")


def measure(directory: str, files: int, bytes_a_file: int, rounds: int) -> SyncCost:
    """``rounds`` groups, each appending ``bytes_a_file`` to each of ``files`` files and
    making them durable as a node does now, then the same bytes in one journal file."""
    write_back = load_write_back()
    if write_back is None:
        raise RuntimeError("needs Linux 5.8 or later (sync_file_range reporting errors)")
    size = bytes_a_file * rounds
    with tempfile.TemporaryDirectory(prefix="waltz-sync-", dir=directory) as tmp:
        segments = [_zeroed(os.path.join(tmp, f"segment-{i}"), size) for i in range(files)]
        journal = _zeroed(os.path.join(tmp, "journal"), size * files)
        try:
            data = os.urandom(bytes_a_file)
            group = data * files

            def segments_round(r: int) -> None:
                offset = r * bytes_a_file
                for fd in segments:
                    os.pwrite(fd, data, offset)
                for fd in segments[1:]:
                    _checked(write_back, fd, offset, bytes_a_file, SYNC_FILE_RANGE_WRITE)
                wait = SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE
                for fd in segments[1:]:
                    _checked(
                        write_back, fd, offset, bytes_a_file, wait | SYNC_FILE_RANGE_WAIT_AFTER
                    )
                os.fdatasync(segments[0])  # its flush of the disk's cache covers the others

            def journal_round(r: int) -> None:
                os.pwrite(journal, group, r * len(group))
                os.fdatasync(journal)

            timed = [_timed(segments_round, rounds), _timed(journal_round, rounds)]
        finally:
            for fd in [*segments, journal]:
                os.close(fd)
    (seg_ms, seg_cpu), (jou_ms, jou_cpu) = timed
    return SyncCost(files, bytes_a_file, rounds, seg_ms, seg_cpu, jou_ms, jou_cpu)


def _timed(round_: Callable[[int], None], rounds: int) -> tuple[float, float]:
    """(median wall ms a round, CPU us a round) of ``round_(0..rounds-1)``."""
    walls = []
    cpu = time.process_time()
    for r in range(rounds):
        started = time.perf_counter()
        round_(r)
        walls.append(time.perf_counter() - started)
    return statistics.median(walls) * 1e3, (time.process_time() - cpu) / rounds * 1e6


def describe(cost: SyncCost) -> str:
    return (
        f"| {cost.files} | {cost.files * cost.bytes_a_file:,} | {cost.segments_ms:.3f} | "
        f"{cost.segments_cpu_us:,.0f} | {cost.journal_ms:.3f} | {cost.journal_cpu_us:,.0f} | "
        f"{cost.segments_ms / cost.journal_ms:.1f}x |"
    )


HEADER = (
    "| files a group | bytes a group | a file each: ms a group (median) | CPU us | "
    "one journal: ms | CPU us | a file each / journal |\n"
    "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
)
