"""The compiled per-record loops (``_native.c``), or ``None`` where they are not built.

``pip install`` compiles them where it finds a C compiler (setup.py; the extension is
optional). Each caller keeps its pure-Python loop: it runs where the module is missing,
and, after the compiled one found a record wrong, again to say precisely what.
``WALTZ_PURE_PYTHON=1`` turns the compiled loops off (to compare, or to rule them out).
"""

from __future__ import annotations

import os
from types import ModuleType


def _load() -> ModuleType | None:
    if os.environ.get("WALTZ_PURE_PYTHON", "").lower() in ("1", "true", "yes"):
        return None
    try:
        from . import _native
    except ImportError:
        return None
    return _native


native = _load()

__all__ = ["native"]
