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

Silence is not proof: a long non-streaming request gets its response headers only when
it is done. So before a worker is called hung it is asked (``probe``, see
:mod:`infera_core.server.liveness`): its engine's progress counters are read twice a
few seconds apart. Counters that moved show a busy worker that is alive: it is left
alone for another ``T`` and its requests keep running (none is run twice). A worker
that does not answer, or whose counters stand still while requests wait on it, is hung
(it computes nothing, so retrying its requests elsewhere runs nothing twice). A worker
whose ``/metrics`` answers without such counters is taken as alive.

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
from collections.abc import Awaitable, Callable, Iterable

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


Probe = Callable[[Endpoint, float], Awaitable[str | None]]
"""``probe(endpoint, timeout)``: the worker's progress reading, ``""`` when it answered
without one, None when it did not answer (:func:`infera_core.server.liveness.progress`)."""

_UNREAD = object()


class _Asking:
    """The liveness probe of one stuck worker: its first reading, and the probe running."""

    __slots__ = ("at", "first", "task")

    def __init__(self) -> None:
        self.first: object = _UNREAD
        self.at = 0.0
        self.task: asyncio.Future[str | None] | None = None


class HangDetector:
    """Feeds the breakers from first-byte outliers; ``timeout`` 0 turns it off."""

    __slots__ = (
        "_asking",
        "_clock",
        "_last",
        "_loop",
        "_timer",
        "_waiting",
        "breakers",
        "factor",
        "on_trip",
        "peers",
        "probe",
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
        probe: Probe | None = None,
    ) -> None:
        self.breakers = breakers
        self.probe = probe
        """Asked before a worker is called hung (None: silence alone is the verdict)."""
        self._asking: dict[str, _Asking] = {}
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
        self._stop_asking(worker_id)
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
                if (ep.record.model, ep.record.role) in live and self._not_working(ep, now, bar):
                    self._trip(ep, waiting, now - min(w.since for w in waiting), bar)
        for wid in [wid for wid in self._asking if wid not in stuck]:
            self._stop_asking(wid)
        if any(self._waiting.values()):
            self._arm()

    def _not_working(self, ep: Endpoint, now: float, bar: float) -> bool:
        """Whether the silent worker ``ep`` is shown not to work (see the module docstring);
        False while that is still being found out (probes run between checks)."""
        if self.probe is None:
            return True
        wid = ep.worker_id
        asking = self._asking.get(wid)
        if asking is None:
            asking = self._asking[wid] = _Asking()
        if asking.task is None:
            if asking.first is _UNREAD or now - asking.at >= min(5.0, max(0.5, bar / 8)):
                timeout = min(2.0, max(0.25, bar / 2))
                asking.task = asyncio.ensure_future(self.probe(ep, timeout))
            return False
        if not asking.task.done():
            return False
        reading = None if asking.task.cancelled() or asking.task.exception() else asking.task.result()
        asking.task = None
        if reading is None:
            return True  # no answer: dead or wedged
        if reading and asking.first is _UNREAD:
            asking.first, asking.at = reading, now
            return False  # read again a little later
        if reading and reading == asking.first:
            return True  # answers, but nothing moves while requests wait on it
        log.info(
            "worker %s answered no request for %.1f s but is working (%s): not hung",
            wid,
            now - self._last.get(wid, now - bar),
            "its engine's counters moved" if reading else "its /metrics answered",
        )
        self._last[wid] = now
        self._stop_asking(wid)
        return False

    def _stop_asking(self, wid: str) -> None:
        asking = self._asking.pop(wid, None)
        if asking is not None and asking.task is not None:
            asking.task.cancel()

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
        self._stop_asking(ep.worker_id)
        ep.breaker_open = True
        ep.breaker_retry_at = self._clock() + max(self.breakers.cooldown, bar)
        for w in list(waiting):
            w.hung = True
            if w.task is not None and not w.task.done():
                w.task.cancel()
