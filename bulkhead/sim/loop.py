"""Virtual time: an asyncio event loop whose clock only moves when nothing is ready.

The router's request path is asyncio code (`DisaggBackend.generate`), so the
simulator's event queue *is* an asyncio loop: every simulated event (a message
landing, a tick, an engine step) is a timer on it, and when no callback is
ready the loop jumps its clock to the next timer instead of sleeping. One
thread, no wall-clock reads: the same seed gives the same run, event for event.
"""

from __future__ import annotations

import asyncio
import selectors


class Deadlock(RuntimeError):
    """Nothing is ready and nothing is scheduled, yet the run is not over."""


class _VirtualSelector(selectors.BaseSelector):
    """Never waits: a select(timeout) advances the virtual clock by timeout."""

    def __init__(self, loop: VirtualLoop):
        self._loop = loop
        self._map: dict = {}

    def register(self, fileobj, events, data=None):
        key = selectors.SelectorKey(fileobj, id(fileobj), events, data)
        self._map[fileobj] = key
        return key

    def unregister(self, fileobj):
        return self._map.pop(fileobj)

    def select(self, timeout=None):
        if timeout is None:
            raise Deadlock("the simulated system has no event left to run")
        self._loop.now += max(0.0, timeout)
        return []

    def close(self):
        self._map.clear()

    def get_map(self):
        return self._map


class VirtualLoop(asyncio.BaseEventLoop):
    def __init__(self, start: float = 0.0):
        super().__init__()
        self.now = start
        self._selector = _VirtualSelector(self)
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self.now

    def _process_events(self, event_list) -> None:
        pass

    def _write_to_self(self) -> None:
        pass  # call_soon_threadsafe from this very thread: nothing to wake
