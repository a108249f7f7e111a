"""Durable file-system changes: what every writer of files on disk shares."""

from __future__ import annotations

import os


def fsync_directory(path: str) -> None:
    """fsync the directory ``path``: a file created, renamed or deleted in it survives a
    crash only once its directory entry is on disk too."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
