"""The event loop waltz runs its asyncio code on: uvloop where it is installed.

uvloop's loop and transports are written in C. The daemons, the blocking client and every
``waltz`` command that drives the client run on it. On asyncio's own loop a client
spends more CPU on each write, and at one write in flight each write takes longer:
docs/benchmarks.md (thirteenth section) has the figures.

``WALTZ_EVENT_LOOP=asyncio`` chooses asyncio's own loop instead. Use it to rule uvloop
out when debugging, or to reproduce a measurement taken on it. ``uvloop``, the default,
falls back to asyncio's loop only where uvloop is not installed: it is a dependency
wherever it builds.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

T = TypeVar("T")

ENV = "WALTZ_EVENT_LOOP"
CHOICES = ("uvloop", "asyncio")


class EventLoopChoiceError(ValueError):
    """``WALTZ_EVENT_LOOP`` names no loop we run on."""


def chosen(environ: Mapping[str, str] = os.environ) -> str:
    """The loop ``WALTZ_EVENT_LOOP`` names: ``uvloop`` when it is unset or empty."""
    raw = environ.get(ENV, "")
    name = raw.strip().lower() or "uvloop"
    if name not in CHOICES:
        raise EventLoopChoiceError(f"{ENV}={raw!r}: expected one of {', '.join(CHOICES)}")
    return name


def loop_factory(
    environ: Mapping[str, str] = os.environ,
) -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes a new loop of the chosen kind."""
    if chosen(environ) == "uvloop":
        try:
            import uvloop
        except ImportError:  # pragma: no cover - a dependency wherever it builds
            return asyncio.new_event_loop
        return uvloop.new_event_loop
    return asyncio.new_event_loop


def describe(environ: Mapping[str, str] = os.environ) -> str:
    """The loop a process runs on, for a benchmark's header: ``uvloop`` or ``asyncio``."""
    factory = loop_factory(environ)
    return "asyncio" if factory is asyncio.new_event_loop else "uvloop"


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new loop of the chosen kind (for a thread that runs one, as the blocking client's)."""
    return loop_factory()()


def run(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on the chosen loop."""
    try:
        factory = loop_factory()  # a bad WALTZ_EVENT_LOOP fails here, before anything starts
    except EventLoopChoiceError:
        coro.close()  # never to run: no "never awaited" warning
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)
