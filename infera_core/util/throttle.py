"""At most one log line per key per interval, with a count of the lines held back.

``LogThrottle(60).allow(key)`` returns None while the key's window is open (the line is
suppressed and counted) and, once it may log again, the number of lines suppressed since
its last line (0 for the first). So a per-request warning becomes one line a minute per
model: ``… (12 similar lines suppressed in the last 60 s)``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable


class LogThrottle:
    """See the module docstring. ``clock``: seconds, monotonic (tests pass their own)."""

    __slots__ = ("_clock", "_last", "_suppressed", "interval")

    def __init__(self, interval: float = 60.0, clock: Callable[[], float] | None = None) -> None:
        self.interval = interval
        self._clock = clock or time.monotonic
        self._last: dict[Hashable, float] = {}
        self._suppressed: dict[Hashable, int] = {}

    def allow(self, key: Hashable) -> int | None:
        """None: suppress this line; else log it, noting this many suppressed before it."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return None
        self._last[key] = now
        return self._suppressed.pop(key, 0)

    def note(self, suppressed: int) -> str:
        """The suffix for a line that follows ``suppressed`` held-back ones ('' for none)."""
        if not suppressed:
            return ""
        return f" ({suppressed} similar line{'s' if suppressed != 1 else ''} suppressed in the last {self.interval:g} s)"
