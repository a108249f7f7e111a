"""Holding SIGINT and SIGTERM back while a child process is started and recorded."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

_HELD_SIGNALS: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Run SIGINT and SIGTERM's Python handlers only once the block is over (at its end,
    in arrival order), so that they cannot interrupt it halfway. Only the main thread
    runs Python signal handlers; elsewhere, and for SIG_IGN or SIG_DFL, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    held: dict[int, Callable[[int, FrameType | None], Any]] = {}
    for signum in _HELD_SIGNALS:
        handler = signal.getsignal(signum)
        if callable(handler):
            held[signum] = handler
            signal.signal(signum, lambda s, _frame: pending.append(s))
    try:
        yield
    finally:
        for signum, handler in held.items():
            signal.signal(signum, handler)
        for signum in pending:
            held[signum](signum, None)  # may raise (KeyboardInterrupt): the caller cleans up
