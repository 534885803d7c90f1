"""The latest ``busy`` time of any worker, so ``predicted-latency`` skips the backlog pass when no
worker has one.

At light load every prefill queue is empty when the next request comes (its first token came
back, the queue moved to it): the backlog of every candidate is then 0 and ``predicted-guard``'s
and the scorer's passes over the fleet would only compute zeros. :class:`LatestBusy` keeps
every value written to the ``busy`` column in a max-heap (entries that the row's current value
no longer matches are dropped when they surface), so "is any queue busy past now?" is a look at
the top. Never a wrong "no": a value it cannot order (NaN) makes it answer "yes" from then on.
"""

from __future__ import annotations

import heapq
import math

from infera_core.scheduling.arrays import Floats


class LatestBusy:
    """An upper bound of a ``busy`` column's values, exact once stale entries are dropped."""

    __slots__ = ("_heap", "_unordered")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int]] = []
        """(−busy, row) of every value written (a max-heap)."""
        self._unordered = False
        """A NaN was written: every query answers "busy" (the arrays then decide)."""

    def wrote(self, row: int, value: float) -> None:
        """``busy[row] = value`` was just written."""
        if math.isnan(value):
            self._unordered = True
            return
        heapq.heappush(self._heap, (-value, row))

    def busy_after(self, now: float, busy: Floats) -> bool:
        """Whether some row of ``busy`` may be busy past ``now`` (rows never written hold 0)."""
        if self._unordered or now < 0.0:
            return True
        heap = self._heap
        while heap:
            top, row = heap[0]
            if float(busy[row]) == -top:
                return -top > now
            heapq.heappop(heap)  # overwritten since (or its row reset): stale
        return False

    def compact(self, busy: Floats) -> None:
        """Drop stale entries when the heap holds many more than the rows (called now and then)."""
        if len(self._heap) > 4 * len(busy) + 64:
            self._heap = [(-float(b), r) for r, b in enumerate(busy.tolist()) if b > 0.0]
            heapq.heapify(self._heap)
