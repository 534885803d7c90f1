"""Circuit breakers, one per worker, kept on the :class:`Endpoint` itself.

Closed → (``threshold`` consecutive failures) → open: the ``health`` filter skips the
worker until ``breaker_retry_at``; then one request goes through as a half-open
probe (the pick pushes ``breaker_retry_at`` forward so only one probe is in flight).
Success closes the breaker; failure re-opens it for another cool-down. Only
worker-side failures count (connect errors, timeouts, 5xx) — never a client's 4xx.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from infera_core.scheduling.types import Endpoint

log = logging.getLogger("infera.server.breaker")

ISOLATE_S = 60.0
"""Seconds an isolated worker (not an engine) stays out of rotation before one probe."""


class Breakers:
    __slots__ = ("_clock", "_fails", "cooldown", "opened", "threshold")

    def __init__(self, threshold: int, cooldown: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.threshold = threshold
        self.cooldown = cooldown
        self._clock = clock
        self._fails: dict[str, int] = {}
        self.opened = 0
        """How many times any breaker opened (a metric)."""

    def picked(self, ep: Endpoint) -> None:
        if ep.breaker_open:
            ep.breaker_retry_at = self._clock() + self.cooldown

    def success(self, ep: Endpoint) -> None:
        if ep.breaker_open:
            log.info("breaker closed for worker %s (probe succeeded)", ep.worker_id)
            ep.breaker_open = False
        if self._fails:
            self._fails.pop(ep.worker_id, None)

    def failure(self, ep: Endpoint) -> None:
        n = self._fails.get(ep.worker_id, 0) + 1
        self._fails[ep.worker_id] = n
        if ep.breaker_open or n >= self.threshold:
            if not ep.breaker_open:
                self.opened += 1
                log.warning("breaker opened for worker %s after %d consecutive failures", ep.worker_id, n)
            ep.breaker_open = True
            ep.breaker_retry_at = self._clock() + self.cooldown

    def isolate(self, ep: Endpoint, why: str, recheck: float = ISOLATE_S) -> None:
        """Take ``ep`` out of rotation for ``recheck`` seconds (at least the cool-down) whatever
        its failure count: it is not a working engine (e.g. its URL is a router). Then one
        request probes it as for any open breaker; one line is logged."""
        if not ep.breaker_open:
            self.opened += 1
        log.warning("worker %s taken out of rotation: %s", ep.worker_id, why)
        ep.breaker_open = True
        ep.breaker_retry_at = self._clock() + max(recheck, self.cooldown)

    def state(self, ep: Endpoint) -> str:
        if not ep.breaker_open:
            return "closed"
        return "half-open" if self._clock() >= ep.breaker_retry_at else "open"

    def forget(self, worker_id: str) -> None:
        self._fails.pop(worker_id, None)
