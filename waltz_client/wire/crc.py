"""CRC-32 (zlib's polynomial) for the records' checksums.

ISA-L's folding implementation (the ``isal`` package) checks 1 KiB in about half zlib's
time, and every record's data is checked at each hop of an append and a read; zlib's
gives the same values and stands in where isal is not installed.
"""

from __future__ import annotations

try:
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - isal is a dependency; zlib is the same function
    from zlib import crc32

__all__ = ["crc32"]
