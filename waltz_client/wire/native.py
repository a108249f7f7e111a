"""The compiled per-record loops (``_native.c``), or ``None`` where they are not built.

``pip install`` compiles them where it finds a C compiler (setup.py; the extension is
optional). Each caller keeps its pure-Python loop: it runs where the module is missing,
and, after the compiled one found a record wrong, again to say precisely what.
``WALTZ_PURE_PYTHON=1`` turns the compiled loops off (to compare, or to rule them out).
"""

from __future__ import annotations

import os
from types import ModuleType


def _pure_python_asked() -> bool:
    return os.environ.get("WALTZ_PURE_PYTHON", "").lower() in ("1", "true", "yes")


def _load() -> ModuleType | None:
    if _pure_python_asked():
        return None
    try:
        from . import _native
    except ImportError:
        return None
    return _native


native = _load()


def describe() -> str:
    """Which loops this process runs, for logs and benchmark headers."""
    if native is not None:
        return "compiled" + (", CRC-32 by CLMUL" if native.CLMUL else ", CRC-32 by tables")
    if _pure_python_asked():
        return "Python (WALTZ_PURE_PYTHON)"
    return "Python (the compiled ones are not built)"


__all__ = ["describe", "native"]
