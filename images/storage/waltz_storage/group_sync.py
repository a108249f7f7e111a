"""Group commit across partitions: one syncfs when several partitions appended at once.

The node's I/O thread writes a group of requests of any number of partitions, then makes
the appends durable before answering. One partition's appends: an fdatasync of its
segment (written ahead with zeros, so no journal commit), the cheapest call for one
file. Several partitions' appends: one ``syncfs(2)``, which makes every file of the
filesystem durable, so N partitions pay one flush, not N.
Measured here (1 KiB appends): fsyncing 4 files one after another costs 388 us of CPU a
round (1,113 rounds/s); one syncfs after writing the 4 costs 97 us (4,107 rounds/s).

syncfs reports writeback errors only since Linux 5.8: on an older kernel, or without a
libc that has it, each partition keeps its own fsync. After a syncfs fails, every later
one fails too: the page cache can no longer be trusted, so the partitions that append
stop serving until a restart recovers them (as after a failed fsync).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform
from collections.abc import Callable

log = logging.getLogger(__name__)

# syncfs(fd) -> 0, or -1 with errno set.
SyncFs = Callable[[int], int]


def kernel_reports_syncfs_errors(release: str) -> bool:
    """True for a Linux release string of 5.8 or later, where syncfs returns errors."""
    major, _, rest = release.partition(".")
    minor = ""
    for c in rest:
        if not c.isdigit():
            break
        minor += c
    if not major.isdigit() or not minor:
        return False
    return (int(major), int(minor)) >= (5, 8)


def load_syncfs() -> SyncFs | None:
    """libc's syncfs, on a Linux whose syncfs reports errors; else None."""
    if platform.system() != "Linux" or not kernel_reports_syncfs_errors(platform.release()):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        function = libc.syncfs
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int]
    function.restype = ctypes.c_int
    return function


def already_durable(fd: int) -> None:
    """A segment's ``sync_data`` after a syncfs that covered it."""


class GroupSync:
    """The syncfs of the filesystem holding a storage directory. Called from the node's
    I/O thread only."""

    def __init__(self, directory: str, syncfs: SyncFs | None) -> None:
        self._syncfs = syncfs
        # syncfs reports the errors since this descriptor was opened: ours alone, so
        # no other caller can consume an error before we see it.
        self._dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY) if syncfs else -1
        self._error: OSError | None = None
        self.syncs = 0  # syncfs calls made (tests, metrics)

    @classmethod
    def for_directory(cls, directory: str, enabled: bool = True) -> GroupSync:
        syncfs = load_syncfs() if enabled else None
        if enabled and syncfs is None:
            log.info("no syncfs that reports errors (Linux 5.8+) here: one fsync a partition")
        return cls(directory, syncfs)

    @property
    def available(self) -> bool:
        return self._syncfs is not None

    def sync_filesystem(self) -> None:
        """Make every file of the directory's filesystem durable; OSError if not (and
        from then on)."""
        if self._syncfs is None:
            raise OSError("syncfs is not available here")
        if self._error is not None:
            raise self._error
        self.syncs += 1
        if self._syncfs(self._dir_fd) != 0:
            code = ctypes.get_errno()
            self._error = OSError(code, f"syncfs failed: {os.strerror(code)}")
            raise self._error

    def close(self) -> None:
        if self._dir_fd >= 0:
            os.close(self._dir_fd)
            self._dir_fd = -1
