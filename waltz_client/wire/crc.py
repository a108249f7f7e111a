"""CRC-32 (zlib's polynomial) for the records' checksums.

Every record's data is checked at each hop of an append and a read. The compiled module
(``_native.c``: carry-less multiplication folding) checks 1 KiB in about 0.11 us from
Python, ISA-L's (the ``isal`` package) in 0.19 us, zlib's in 0.36 us; all give the same
values, and each stands in where the one before it is not there.
"""

from __future__ import annotations

from .native import native

if native is not None:
    crc32 = native.crc32
else:  # pragma: no cover - the pure-Python install
    try:
        from isal.isal_zlib import crc32
    except ImportError:  # isal is a dependency; zlib is the same function
        from zlib import crc32

__all__ = ["crc32"]
