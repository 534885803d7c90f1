"""API-key budgets shared by the processes of ``infera-run serve --processes N``.

The supervisor makes one :class:`SharedBudgets` before it forks the server processes
(restarted ones are forked from it too, so every process maps the same memory). Each
key *name* owns one slot, found by a hash of the name in a small open-addressed table
(a slot is claimed on first sight, under a lock, when a process loads the key file; a
key keeps its slot, and what it spent, for the life of the serve). A slot holds, as
64-bit words::

    [hash, hash, rpm, bucket, refilled, -, (day, tokens) for process 0 .. N-1]

* ``requests_per_minute`` — one token bucket for the router (``bucket`` refilled at
  ``rpm / 60`` per second since ``refilled``, on the system-wide monotonic clock), read
  and updated under the slot's lock: an ``fcntl`` byte-range lock on the table's memory
  file (byte ``1 + k`` for slot ``k``, byte 0 for the table; two system calls per lock and
  unlock). The kernel drops a lock when its holder dies, so a process killed in the
  middle cannot wedge the others.
  ``rpm`` is the limit the bucket was filled for: the first process to load a changed
  limit refills the bucket, the others find it done.
* ``tokens_per_day`` — each process adds the tokens it served to its own
  ``(day, tokens)`` pair (one writer per word, no lock: a word is one aligned 8-byte
  store through a ``memoryview``); today's count is the sum of the pairs stamped today.
  Admission *reserves* a request's most possible cost (:meth:`SharedBudgets.reserve`):
  the check against the sum and the addition to this process's pair happen under the
  slot's lock, so concurrent processes never both take the last of a budget; the end of
  the request adds the difference to the real cost (:meth:`SharedBudgets.settle`, no lock).

Cost per request (``bench/router/key_budgets.py``): one lock and unlock for a key with a rate
limit, a few word reads and writes otherwise.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
from collections.abc import Callable

from infera_core.util.shm import name_hash, shared_memory

log = logging.getLogger("infera.server.keys")

CAPACITY = 16384
"""Keys the table holds; a key past it keeps a per-process budget (logged as an error)."""

_HEAD = 6  # words before the per-process (day, tokens) pairs
_RPM, _BUCKET, _REFILLED = 2, 3, 4


class SharedBudgets:
    """The budget table of one serve, in memory shared across ``fork``."""

    def __init__(self, processes: int, capacity: int = CAPACITY) -> None:
        self.processes = processes
        self.capacity = capacity
        self.width = _HEAD + 2 * processes
        self.index = 0
        """This process's index (:meth:`attach` in each server process)."""
        self._fd, self._map = shared_memory("infera-key-budgets", capacity * self.width * 8)
        self._q = memoryview(self._map).cast("q")
        self._d = memoryview(self._map).cast("d")
        # lock i (0: the table's, 1 + k: slot k's) is byte i of the memory file
        self._acquire: Callable[[int], None] = functools.partial(fcntl.lockf, self._fd, fcntl.LOCK_EX, 1)
        self._release: Callable[[int], None] = functools.partial(fcntl.lockf, self._fd, fcntl.LOCK_UN, 1)

    def attach(self, index: int) -> None:
        """Use the ``(day, tokens)`` pair of process ``index`` (``0 <= index < processes``)."""
        if not 0 <= index < self.processes:
            raise ValueError(f"process index {index} of {self.processes}")
        self.index = index

    def close(self) -> None:
        self._q.release()
        self._d.release()
        self._map.close()
        os.close(self._fd)

    # -- locks -------------------------------------------------------------------------------
    def _lock_arg(self, base: int | None) -> int:
        """The lock of the slot at word ``base`` (None: the table's)."""
        return 0 if base is None else 1 + base // self.width

    def _lock(self, arg: int) -> None:
        self._acquire(arg)

    def busy(self, base: int) -> bool:
        """True while another process holds the lock of the slot at ``base`` (diagnostics)."""
        arg = self._lock_arg(base)
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, arg)
        except OSError:
            return True
        self._release(arg)
        return False

    # -- slots -------------------------------------------------------------------------------
    def slot(self, name: str) -> int | None:
        """The first word of ``name``'s slot (claimed if new); None when the table is full."""
        h1, h2 = name_hash(name)
        q = self._q
        table = self._lock_arg(None)
        self._lock(table)
        try:
            start = h1 % self.capacity
            for probe in range(self.capacity):
                base = ((start + probe) % self.capacity) * self.width
                if q[base] == h1 and q[base + 1] == h2:
                    return base
                if q[base] == 0 and q[base + 1] == 0:
                    q[base + _RPM] = -1  # no limit applied yet
                    for i in range(base + _HEAD, base + self.width, 2):
                        q[i] = -1
                        q[i + 1] = 0
                    q[base + 1] = h2
                    q[base] = h1
                    return base
        finally:
            self._release(table)
        return None

    def set_rate(self, base: int, rpm: int | None, clock: Callable[[], float]) -> None:
        """Fill the bucket when the limit changed since it was last filled."""
        limit = rpm or 0
        arg = self._lock_arg(base)
        self._lock(arg)
        try:
            if self._q[base + _RPM] != limit:
                self._q[base + _RPM] = limit
                self._d[base + _BUCKET] = float(limit)
                self._d[base + _REFILLED] = clock()
        finally:
            self._release(arg)

    def take(self, base: int, rpm: int, clock: Callable[[], float]) -> float:
        """Take one request from the router's bucket: -1.0 when taken, else the bucket's level
        (below 1). The clock is read under the lock, so no process moves ``refilled`` back."""
        d = self._d
        arg = 1 + base // self.width
        self._acquire(arg)
        try:
            now = clock()
            bucket = d[base + 3] + (now - d[base + 4]) * (rpm / 60.0)  # _BUCKET, _REFILLED
            if bucket > rpm:
                bucket = float(rpm)
            d[base + 4] = now
            if bucket < 1.0:
                d[base + 3] = bucket
                return bucket
            d[base + 3] = bucket - 1.0
            return -1.0
        finally:
            self._release(arg)

    def tokens(self, base: int, day: int) -> int:
        """Tokens spent on ``day`` by every process."""
        q = self._q
        total = 0
        for i in range(base + _HEAD, base + self.width, 2):
            if q[i] == day:
                total += q[i + 1]
        return total

    def add_tokens(self, base: int, day: int, n: int) -> None:
        """Add ``n`` tokens spent by this process on ``day`` (its own words: no lock)."""
        q = self._q
        i = base + _HEAD + 2 * self.index
        if q[i] != day:
            q[i + 1] = 0  # before the new day's stamp: a reader never counts yesterday's as today's
            q[i] = day
        q[i + 1] += n

    def reserve(self, base: int, day: int, n: int, limit: int) -> int:
        """Reserve ``n`` of ``day``'s ``limit`` tokens for this process, under the slot's lock
        (so two processes cannot both take the last of a budget): -1 when reserved, else the
        tokens already spent or reserved (``n`` did not fit)."""
        arg = 1 + base // self.width
        self._acquire(arg)
        try:
            used = self.tokens(base, day)
            if used >= limit or used + n > limit:
                return used
            self.add_tokens(base, day, n)
            return -1
        finally:
            self._release(arg)

    def settle(self, base: int, day: int, delta: int) -> None:
        """Correct a reservation made on ``day`` by ``delta`` tokens (the real cost minus the
        reservation); after a UTC midnight the reservation went with the old day: no-op."""
        q = self._q
        i = base + _HEAD + 2 * self.index
        if q[i] == day:
            q[i + 1] += delta
