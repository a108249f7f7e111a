"""A deterministic asyncio event loop on a virtual clock.

The loop never blocks: when nothing is ready it jumps the clock to the next timer. With
no real I/O (every connection is simulated, see ``sim_net``), no threads and one seeded
random generator, a run is a pure function of its seed: the same seed gives the same
interleaving, the same trace and the same failure.
"""

from __future__ import annotations

import asyncio
import selectors


class Deadlock(Exception):
    """Nothing is ready and no timer is due: every task waits on something that never
    comes."""


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0


class _VirtualSelector(selectors.BaseSelector):
    """Holds registrations (the loop's self-pipe) and turns a wait into a clock jump."""

    def __init__(self, clock: _Clock) -> None:
        self._clock = clock
        self._keys: dict[int, selectors.SelectorKey] = {}

    def register(self, fileobj, events, data=None):
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._keys[fd] = key
        return key

    def unregister(self, fileobj):
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return self._keys.pop(fd)

    def modify(self, fileobj, events, data=None):
        self.unregister(fileobj)
        return self.register(fileobj, events, data)

    def select(self, timeout=None):
        if timeout is None:
            raise Deadlock("no task can make progress and no timer is due")
        self._clock.now += max(0.0, timeout)
        return []

    def get_map(self):
        return self._keys

    def close(self) -> None:
        self._keys.clear()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._virtual = _Clock()
        super().__init__(_VirtualSelector(self._virtual))
        self.set_debug(False)

    def time(self) -> float:
        return self._virtual.now
