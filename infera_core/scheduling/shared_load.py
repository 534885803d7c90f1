"""Requests in flight per worker, counted for the whole router under ``serve --processes N``.

``--max-inflight-per-worker`` caps what one worker has in flight from the router. With N
server processes each sees only its own requests, so the supervisor makes this table
before it forks (restarted processes are forked from it too): one slot per worker, found
by a hash of its id, holding as 64-bit words::

    [hash, hash, present, count of process 0 .. count of process N-1]

* A process writes only its own count: every change of ``Endpoint.in_flight`` is mirrored
  there (one aligned 8-byte store, no lock), and the cap check reads the slot's sum. The
  only overshoot is two processes admitting to the same worker in the same few
  microseconds, each before the other's store: at most N − 1 over, for that moment.
* ``present`` has bit ``i`` set while process ``i`` routes to the worker. A process claims
  the slot when it first sees the worker and leaves it (its count zeroed) when the worker
  goes; a slot nobody is present in may be taken by another worker. Claiming and leaving
  take an ``fcntl`` lock on the table (rare: fleet changes, not requests).
* A restarted process clears its counts and bits first (:meth:`SharedLoad.attach`): what a
  crashed process had in flight no longer counts against anyone's cap.

A worker past the table's capacity (logged as an error) is capped per process, as before.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from infera_core.scheduling.arrays import EndpointArrays, Rows
from infera_core.util.shm import name_hash, shared_memory

log = logging.getLogger("infera.scheduling.shared_load")

CAPACITY = 16384
"""Workers the table holds (live ones; a slot is reused once every process let its worker go)."""

_HEAD = 3  # hash, hash, present
_PRESENT = 2


class SharedLoad:
    """The in-flight table of one serve, in memory shared across ``fork``."""

    def __init__(self, processes: int, capacity: int = CAPACITY) -> None:
        if not 1 <= processes <= 63:
            raise ValueError(f"{processes} processes (1..63 share an in-flight table)")
        self.processes = processes
        self.capacity = capacity
        self.width = _HEAD + processes
        self.index = 0
        """This process's index (:meth:`attach` in each server process)."""
        self._fd, self._map = shared_memory("infera-in-flight", capacity * self.width * 8)
        self.q = memoryview(self._map).cast("q")
        """The table as words: ``q[word]`` is one count (:meth:`word`)."""
        self.table = np.frombuffer(self._map, np.int64).reshape(capacity, self.width)
        self._columns = [self.table[:, _HEAD + i] for i in range(processes)]
        self.unslotted = 0
        """This process's endpoints that found the table full (counted per process)."""

    def close(self) -> None:
        del self.table, self._columns
        self.q.release()
        self._map.close()
        os.close(self._fd)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        fcntl.lockf(self._fd, fcntl.LOCK_EX, 1, 0)
        try:
            yield
        finally:
            fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, 0)

    def attach(self, index: int) -> None:
        """Count as process ``index`` (``0 <= index < processes``), clearing what an earlier
        process of that index left (a crash leaves its counts and bits)."""
        if not 0 <= index < self.processes:
            raise ValueError(f"process index {index} of {self.processes}")
        self.index = index
        with self._locked():
            self.table[:, _HEAD + index] = 0
            self.table[:, _PRESENT] &= ~(1 << index)

    # -- slots (fleet changes) --------------------------------------------------------------
    def claim(self, worker_id: str, in_flight: int = 0) -> int:
        """The slot of ``worker_id`` (this process now present in it, counting ``in_flight``);
        -1 when the table is full."""
        h1, h2 = name_hash(worker_id)
        t = self.table
        bit = 1 << self.index
        with self._locked():
            start = h1 % self.capacity
            reusable = -1
            for probe in range(self.capacity):
                slot = (start + probe) % self.capacity
                a, b, present = (int(x) for x in t[slot, :_HEAD])
                if a == h1 and b == h2:
                    break
                if a == 0 and b == 0:  # never used: the key is not further on
                    slot = reusable if reusable >= 0 else slot
                    break
                if present == 0 and reusable < 0:
                    reusable = slot
            else:
                slot = reusable
            if slot < 0:
                log.error(
                    "in-flight table full (%d workers): %s is capped per process", self.capacity, worker_id
                )
                return -1
            if (int(t[slot, 0]), int(t[slot, 1])) != (h1, h2):
                t[slot, _HEAD:] = 0  # a free slot, or one every process left (counts zeroed)
                t[slot, 1] = h2
                t[slot, 0] = h1
            t[slot, _HEAD + self.index] = in_flight
            t[slot, _PRESENT] |= bit
        return slot

    def leave(self, slot: int) -> None:
        """This process no longer routes to the slot's worker: its count goes, its bit too."""
        with self._locked():
            self.table[slot, _HEAD + self.index] = 0
            self.table[slot, _PRESENT] &= ~(1 << self.index)

    # -- counts (the request path) ----------------------------------------------------------
    def word(self, slot: int) -> int:
        """The word of this process's count in ``slot`` (``q[word] = n`` to set it)."""
        return slot * self.width + _HEAD + self.index

    def in_flight(self, slot: int) -> int:
        """The slot's worker's requests in flight, all processes together."""
        first = slot * self.width + _HEAD
        return sum(self.q[first : first + self.processes])

    def in_flight_rows(self, arrays: EndpointArrays, rows: Rows) -> Rows:
        """:meth:`in_flight` of the endpoints at ``rows`` (their own count where they have no slot)."""
        slots = arrays.load_slot[rows]
        columns = self._columns
        totals: Rows = columns[0][slots]
        for column in columns[1:]:
            totals += column[slots]
        if self.unslotted:
            totals = np.where(slots >= 0, totals, arrays.in_flight[rows])
        return totals
