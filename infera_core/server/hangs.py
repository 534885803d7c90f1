"""Hung-worker detection: per-worker first-byte outliers open the worker's breaker.

A worker that accepts requests and never answers (its ``/health`` may still say OK)
would otherwise hold every request sent to it until ``--first-byte-timeout``. The
detector keeps, per worker, the requests waiting for their response headers and the
time of the worker's last response headers. A worker is *hung* when

* its oldest waiting request has waited longer than the threshold ``T``, and
* it sent no response headers at all for ``T`` (a slow but live worker keeps answering
  something), and
* a routable peer serving the same model in the same role (mixed, prefill or decode) is
  not stuck too, and either waits for nothing or answered within ``T`` (an outlier is
  judged against its peers: a fleet that is slow everywhere, or a lone worker, is left
  alone; a peer whose requests are merely younger is no evidence either way).

PD legs are watched like mixed requests (:class:`~infera_core.server.pd.legs.Legs`): a
prefill or decode worker that accepts its leg and never answers is judged against the
other prefill (decode) workers of its model.

``T = max(--hang-timeout, --hang-factor × the fleet's typical first-byte latency)``
(an exponentially weighted mean of every answered request), so a fleet whose normal
answers take long raises the bar by itself. A hung worker's breaker opens at once (for
``max(cooldown, T)``, so at most one half-open probe at a time waits on it) and its
waiting requests are cancelled and retried on another worker like any failure before
the first byte. Checks run on a loop timer only while requests are waiting: no task,
nothing to stop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

from infera_core.scheduling.types import Endpoint
from infera_core.server.breaker import Breakers

log = logging.getLogger("infera.server.hangs")

_EWMA = 0.05
"""Weight of one answered request in the fleet's typical first-byte latency."""


class Waiting:
    """One request waiting for a worker's response headers."""

    __slots__ = ("endpoint", "hung", "since", "task")

    def __init__(self, endpoint: Endpoint, since: float, task: asyncio.Task[object] | None) -> None:
        self.endpoint = endpoint
        self.since = since
        self.task = task
        self.hung = False
        """Set when the detector cancelled the request because its worker is hung."""


class HangDetector:
    """Feeds the breakers from first-byte outliers; ``timeout`` 0 turns it off."""

    __slots__ = (
        "_clock",
        "_last",
        "_loop",
        "_timer",
        "_waiting",
        "breakers",
        "factor",
        "on_trip",
        "peers",
        "timeout",
        "typical",
    )

    def __init__(
        self,
        breakers: Breakers,
        peers: Callable[[], Iterable[Endpoint]],
        timeout: float,
        factor: float,
        on_trip: Callable[[Endpoint], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.breakers = breakers
        self.peers = peers
        self.timeout = timeout
        self.factor = factor
        self.on_trip = on_trip
        self._clock = clock
        self._waiting: dict[str, set[Waiting]] = {}
        self._last: dict[str, float] = {}
        """Worker id → when it last sent response headers."""
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.typical = 0.0
        """The fleet's typical first-byte latency in seconds (0 until a request was answered)."""

    @property
    def threshold(self) -> float:
        return max(self.timeout, self.factor * self.typical)

    def begin(self, ep: Endpoint, task: asyncio.Task[object] | None = None) -> Waiting | None:
        """A request to ``ep`` starts waiting for its first byte (None when detection is off).
        ``task``: the request's task (default: the current one), cancelled if ``ep`` hangs."""
        if not self.timeout:
            return None
        if task is None:
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.get_running_loop()
            task = asyncio.current_task(loop)  # with the loop: no getpid()
        w = Waiting(ep, self._clock(), task)
        try:
            self._waiting[ep.worker_id].add(w)
        except KeyError:
            self._waiting[ep.worker_id] = {w}
        if self._timer is None:
            self._arm()
        return w

    def end(self, w: Waiting | None, answered: bool) -> None:
        """The wait is over: ``answered`` when the worker's response headers arrived."""
        if w is None:
            return
        wid = w.endpoint.worker_id
        waiting = self._waiting.get(wid)
        if waiting is not None:
            waiting.discard(w)  # an empty set stays: the next request reuses it
        if answered:
            now = self._last[wid] = self._clock()
            typical = self.typical
            self.typical = typical + (now - w.since - typical) * _EWMA if typical else now - w.since

    def forget(self, worker_id: str) -> None:
        self._last.pop(worker_id, None)
        if not self._waiting.get(worker_id, True):
            del self._waiting[worker_id]

    def _arm(self) -> None:
        loop = self._loop or asyncio.get_running_loop()
        self._timer = loop.call_later(min(1.0, self.timeout / 4), self._check)

    def _check(self) -> None:
        self._timer = None
        if not any(self._waiting.values()):
            return
        now = self._clock()
        bar = self.threshold
        stuck: dict[str, set[Waiting]] = {}
        for wid, waiting in self._waiting.items():
            if not waiting or now - self._last.get(wid, -bar) <= bar:
                continue  # it answered something recently: slow maybe, not hung
            if now - min(w.since for w in waiting) > bar:
                stuck[wid] = waiting
        if stuck:
            live = {
                (ep.record.model, ep.record.role)
                for ep in self.peers()
                if ep.worker_id not in stuck
                and ep.record.routable
                and not ep.breaker_open
                and self._answering(ep.worker_id, now, bar)
            }
            for waiting in list(stuck.values()):
                ep = next(iter(waiting)).endpoint
                if (ep.record.model, ep.record.role) in live:
                    self._trip(ep, waiting, now - min(w.since for w in waiting), bar)
        if any(self._waiting.values()):
            self._arm()

    def _answering(self, wid: str, now: float, bar: float) -> bool:
        """Whether a peer that is not stuck shows the fleet is answering: it waits for nothing,
        or it sent response headers within ``bar``. A peer whose requests wait younger than
        the bar and that answered nothing lately is no evidence yet (under load, a fleet that
        is slow everywhere got its requests a little later on one worker than another)."""
        return not self._waiting.get(wid) or now - self._last.get(wid, -bar) <= bar

    def _trip(self, ep: Endpoint, waiting: set[Waiting], waited: float, bar: float) -> None:
        if not ep.breaker_open:
            self.breakers.opened += 1
            log.warning(
                "worker %s accepted %d request(s) and answered none for %.1f s (hang threshold %.1f s):"
                " breaker opened, its requests retried elsewhere",
                ep.worker_id,
                len(waiting),
                waited,
                bar,
            )
            if self.on_trip is not None:
                self.on_trip(ep)
        ep.breaker_open = True
        ep.breaker_retry_at = self._clock() + max(self.breakers.cooldown, bar)
        for w in list(waiting):
            w.hung = True
            if w.task is not None and not w.task.done():
                w.task.cancel()
