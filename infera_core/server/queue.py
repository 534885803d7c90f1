"""The router queue: a request no worker can take now waits, in order, instead of a 429.

When every candidate of a model is *saturated* (at ``--max-inflight-per-worker``, or over
the engine thresholds ``--queue-engine-waiting`` / ``--queue-engine-kv-usage`` read from the
workers' metrics), the request waits in that model's :class:`~infera_core.scheduling.fairqueue.FairQueue`
(priority tier, then weighted fair share between keys). A slot freeing (a request released,
failed or abandoned) dispatches the head of the queue at once: the slot is taken for the
waiter before it wakes, so no arrival can overtake it. Nothing polls, except with shared
in-flight counts (``serve --processes N``: a slot freed by another process) or engine
thresholds (the engines' numbers change without a local event), where the queue re-checks
every ``RECHECK_S`` while it holds waiters.

Bounds: ``--queue-max`` waiters per model (full: an arrival of a higher tier evicts the newest
sheddable waiter with 503, a flood gives up its own newest waiter, else the arrival gets 429)
and ``--queue-timeout`` seconds (then 503). A TTFT deadline (``X-Infera-Deadline-Ms`` or the
key's ``ttft_deadline_ms``) that the estimated wait cannot meet is answered at once with 429,
and a waiter still queued shortly before its deadline is answered then: before, never after.
Every refusal carries ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from infera_core.request import RequestContext
from infera_core.scheduling.fairqueue import FairQueue, Shares, Waiter, request_cost, tier_label, tier_of
from infera_core.scheduling.scheduler import OverloadedError
from infera_core.scheduling.tierguard import TierGuard
from infera_core.scheduling.types import Endpoint, KvIndexView
from infera_core.server.errors import ApiError
from infera_core.server.reserve import output_limit, prompt_estimate
from infera_core.server.series import LeanCollector, LeanCounter, LeanHistogram

log = logging.getLogger("infera.server.queue")

PRIORITY_HEADER = "x-infera-priority"
DEADLINE_HEADER = "x-infera-deadline-ms"
RECHECK_S = 0.02
"""Re-check period while waiters exist and a slot may free without a local event."""
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

T = TypeVar("T")
Schedule = Callable[[RequestContext, bool, Collection[str]], Endpoint]
"""Pick a worker for a request, ``True``: leaving the headroom free, off the workers named
(raises :class:`OverloadedError` when every worker is saturated)."""


@dataclass(slots=True)
class Ticket:
    """Who a request runs as, for the queue: its fair-share key, tier, weight and deadline."""

    key: str = "-"
    tier: int = 0
    weight: float = 1.0
    deadline_ms: float | None = None


def ticket_for(principal: Any, headers: Any) -> Ticket:
    """The request's :class:`Ticket` from its API key (``principal.key``: priority, weight,
    header permission, default deadline) and its ``X-Infera-Priority`` /
    ``X-Infera-Deadline-Ms`` headers; 400 for a malformed header."""
    key = getattr(principal, "key", None)
    name = getattr(principal, "name", "-") if principal is not None else "-"
    tier = getattr(key, "priority", 0) if key is not None else 0
    weight = getattr(key, "weight", 1.0) if key is not None else 1.0
    deadline = getattr(key, "ttft_deadline_ms", None) if key is not None else None
    wanted = headers.get(PRIORITY_HEADER)
    if wanted is not None:
        try:
            asked = tier_of(wanted)
        except ValueError as exc:
            raise ApiError(
                400, f"X-Infera-Priority: {exc}", param=PRIORITY_HEADER, code="invalid_priority"
            ) from None
        # a key must allow the header; it may lower its tier, never raise it above the key's own
        if key is None or getattr(key, "allow_priority_header", False):
            tier = asked if key is None else min(asked, tier)
    raw = headers.get(DEADLINE_HEADER)
    if raw is not None:
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not (value > 0 and math.isfinite(value)):
            raise ApiError(
                400,
                f"X-Infera-Deadline-Ms must be a positive number of milliseconds, not {raw!r}.",
                param=DEADLINE_HEADER,
                code="invalid_deadline",
            )
        deadline = value if deadline is None else min(value, deadline)
    return Ticket(name, tier, weight, deadline)


class QueueMetrics:
    """``infera_queue_depth{model,tier}`` (gauge), ``infera_queue_wait_seconds{model,tier}``
    (histogram, at dispatch), ``infera_queue_shed_total{model,tier,reason}`` and
    ``infera_queue_served_cost_total{model,key}`` (the fair share's tokens served per key)."""

    def __init__(self) -> None:
        self.wait = LeanHistogram(
            "infera_queue_wait_seconds",
            "Time requests waited in the router queue",
            ["model", "tier"],
            WAIT_BUCKETS,
        )
        self.shed = LeanCounter(
            "infera_queue_shed",
            "Requests the queue refused or dropped, by reason",
            ["model", "tier", "reason"],
        )
        self.served = LeanCounter(
            "infera_queue_served_cost",
            "Cost (uncached prompt + expected output tokens) dispatched from the queue per key",
            ["model", "key"],
        )

    def collector(self) -> LeanCollector:
        return LeanCollector([self.wait, self.shed, self.served])


class _DepthCollector(Collector):
    def __init__(self, queues: Callable[[], Iterable[tuple[str, FairQueue]]]) -> None:
        self._queues = queues

    def collect(self) -> Iterable[Any]:
        g = GaugeMetricFamily(
            "infera_queue_depth", "Requests waiting in the router queue", labels=["model", "tier"]
        )
        for model, q in self._queues():
            for tier, n in q.depth().items():
                g.add_metric([model, tier_label(tier)], n)
        yield g


@dataclass(slots=True, eq=False)
class _Entry:
    ctx: RequestContext
    future: asyncio.Future[Any]
    timer: asyncio.TimerHandle | None = None
    model: str = ""
    take: Callable[[], Any] | None = None
    """How a waiter that is not the plain path takes its slots (a PD pair); None: ``_take``."""
    undo: Callable[[Any], None] | None = None
    """Gives back what ``take`` took, when the client left as it was dispatched."""


class RouterQueue:
    """The per-model queues of one server process (see the module docstring)."""

    def __init__(
        self,
        schedule: Schedule,
        release: Callable[[RequestContext, Endpoint], None],
        slots: Callable[[str], int] = lambda model: 0,
        *,
        max_len: int,
        timeout: float,
        output_cap: int = 1024,
        recheck: bool = False,
        kv_index: KvIndexView | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._schedule = schedule
        self._release = release
        self._slots = slots
        self.headroom = False
        """Whether the schedule keeps headroom (``--queue-headroom``): then keys over their fair
        share of the slots are limited, which needs the shares."""
        self.tier_guard: tuple[float, float, Callable[[str], list[str]]] | None = None
        """``--queue-tier-window``, ``--queue-tier-share`` and the model's worker ids: then a
        :class:`TierGuard` per model keeps lower tiers to part of the fleet (plain requests)."""
        self.guards: dict[str, TierGuard] = {}
        self._tiers: dict[str, tuple[str, str, int]] = {}
        """request_id → (model, worker, tier) of a request counted in ``guards``."""
        self.shares: dict[str, Shares] = {}
        """Requests in flight per key, per model (kept with ``headroom`` only)."""
        self._owners: dict[str, tuple[str, str]] = {}
        """request_id → (model, key) of a request counted in ``shares``."""
        self.max_len = max_len
        self.timeout = timeout
        self.output_cap = output_cap
        self.recheck = recheck
        self.kv_index = kv_index
        self.clock = clock
        self.queues: dict[str, FairQueue] = {}
        self.metrics = QueueMetrics()
        self._recheck_task: asyncio.Task[None] | None = None
        self.refresh: Callable[[], None] | None = None
        """Asks for fresh engine numbers while requests wait (the engine saturation signal)."""

    @property
    def enabled(self) -> bool:
        return self.max_len > 0

    def register_metrics(self, registry: Any) -> None:
        registry.register(self.metrics.collector())
        registry.register(_DepthCollector(lambda: list(self.queues.items())))

    def stats(self) -> dict[str, Any]:
        """Per model: depth per tier and the recent dispatch interval (the dashboard's)."""
        return {
            m: {"depth": {tier_label(t): n for t, n in q.depth().items()}, "interval_s": q.interval}
            for m, q in self.queues.items()
        }

    # -- the request's side ------------------------------------------------------------------
    async def acquire(self, ctx: RequestContext, ticket: Ticket) -> Endpoint:
        """A worker for ``ctx`` with its slot taken (``in_flight`` counted): now, or once the
        queue reaches it. Raises :class:`ApiError` when refused, shed or timed out."""
        ep: Endpoint = await self._acquire(ctx, ticket, None, None)
        return ep

    async def acquire_with(
        self, ctx: RequestContext, ticket: Ticket, take: Callable[[], T], undo: Callable[[T], None]
    ) -> T:
        """What ``take()`` returns (a PD pair, its slots reserved), now or once the queue reaches
        ``ctx``: ``take`` raises :class:`OverloadedError` while it cannot, and is retried in the
        queue's order whenever a slot frees; ``undo`` gives it back if the client left meanwhile.
        Raises :class:`ApiError` when refused, shed or timed out."""
        got: T = await self._acquire(ctx, ticket, take, undo)
        return got

    async def _acquire(
        self,
        ctx: RequestContext,
        ticket: Ticket,
        take: Callable[[], Any] | None,
        undo: Callable[[Any], None] | None = None,
    ) -> Any:
        model = ctx.model
        q = self.queues.get(model)
        if q is None or not len(q):
            try:
                if take is not None:
                    return take()
                return self._take(ctx, ticket.key, ticket.tier, ticket.weight, q)
            except OverloadedError as exc:
                reason = str(exc)
            if q is None:
                q = self.queues[model] = FairQueue(self.max_len)
        else:
            reason = "other requests for this model are queued"
        now = self.clock()
        loop = asyncio.get_running_loop()
        entry = _Entry(ctx, loop.create_future(), None, model, take, undo)
        w = Waiter(ticket.key, ticket.tier, self._cost(ctx), now, None, ticket.weight, entry)
        if ticket.deadline_ms is not None:
            w.deadline = now + ticket.deadline_ms / 1000.0
        refused, evicted = q.offer(w, now)
        if evicted is not None:
            self._drop(q, *evicted)
        if refused == "queue_full":
            self._count(model, w.tier, "queue_full")
            raise ApiError(
                429,
                f"The router queue for model {model!r} is full ({q.max_len} waiting) and {reason}.",
                code="queue_full",
                headers={"Retry-After": self._retry_after(q)},
            )
        if refused == "deadline":
            self._count(model, w.tier, "deadline")
            raise self._deadline_error(model, ticket.deadline_ms, q)
        self.pump(model)
        if w.queued:
            self._arm(w, q, now)
            self._ensure_recheck()
        try:
            return await entry.future
        except asyncio.CancelledError:
            self._cancelled(q, w)
            raise

    def _cancelled(self, q: FairQueue, w: Waiter) -> None:
        entry: _Entry = w.payload
        if entry.timer is not None:
            entry.timer.cancel()
        if q.remove(w):
            return
        fut = entry.future
        if fut.done() and not fut.cancelled() and fut.exception() is None:
            if entry.undo is not None:  # dispatched as the client left: free the slot(s)
                entry.undo(fut.result())
            else:
                self._release(entry.ctx, fut.result())
            self.freed(entry.ctx)

    def _take(self, ctx: RequestContext, key: str, tier: int, weight: float, q: FairQueue | None) -> Endpoint:
        limited = tier < 0
        shares = None
        if self.headroom:
            shares = self.shares.get(ctx.model)
            if shares is None:
                shares = self.shares[ctx.model] = Shares()
            if not limited:
                limited = shares.over(key, weight, self._slots(ctx.model), q)
        ep = self._guarded(ctx, tier, limited) if self.tier_guard else self._schedule(ctx, limited, ())
        ep.in_flight += 1
        if shares is not None:
            shares.started(key, weight)
            self._owners[ctx.request_id] = (ctx.model, key)
        return ep

    def _guarded(self, ctx: RequestContext, tier: int, limited: bool) -> Endpoint:
        """``_schedule`` under the model's :class:`TierGuard`: a guarded tier waits while every
        worker it may use is busy; a higher tier only prefers the workers free of lower ones."""
        assert self.tier_guard is not None
        window, share, workers = self.tier_guard
        guard = self.guards.get(ctx.model)
        if guard is None:
            guard = self.guards[ctx.model] = TierGuard(window, share)
        now = self.clock()
        ids = workers(ctx.model)
        avoid = guard.avoid(tier, ids, now)
        if avoid and len(avoid) == len(ids):
            raise OverloadedError("lower tiers keep off the workers serving a higher tier now")
        try:
            ep = self._schedule(ctx, limited, avoid)
        except OverloadedError:
            if not avoid or guard.guarded(tier, now):
                raise
            ep = self._schedule(ctx, limited, ())
        guard.started(ep.worker_id, tier, now)
        self._tiers[ctx.request_id] = (ctx.model, ep.worker_id, tier)
        return ep

    def freed(self, ctx: RequestContext) -> None:
        """A request's slot freed (answered, failed, abandoned): its key's share, then the
        next waiter."""
        held = self._tiers.pop(ctx.request_id, None) if self._tiers else None
        if held is not None:
            self.guards[held[0]].ended(held[1], held[2])
        owner = self._owners.pop(ctx.request_id, None) if self._owners else None
        if owner is not None:
            self.shares[owner[0]].ended(owner[1])
        if self.queues:
            self.pump(ctx.model)

    def _cost(self, ctx: RequestContext) -> float:
        ids = ctx.token_ids
        prompt = len(ids) if ids else prompt_estimate(ctx.body)
        cached = 0
        index = self.kv_index
        if ids and index is not None:
            cached = _cached_tokens(index, ctx)
        return request_cost(prompt, cached, output_limit(ctx.body, self.output_cap), self.output_cap)

    # -- timers ---------------------------------------------------------------------------------
    def _arm(self, w: Waiter, q: FairQueue, now: float) -> None:
        entry: _Entry = w.payload
        delay, reason = q.expiry(w, self.timeout, now)
        entry.timer = asyncio.get_running_loop().call_later(delay, self._expire, q, w, reason)

    def _expire(self, q: FairQueue, w: Waiter, reason: str) -> None:
        entry: _Entry = w.payload
        entry.timer = None
        if not q.remove(w) or entry.future.done():
            return
        self._count(entry.model, w.tier, reason)
        if reason == "deadline":
            deadline = (w.deadline or w.arrived) - w.arrived
            err = self._deadline_error(entry.model, deadline * 1000.0, q)
        else:
            err = ApiError(
                503,
                f"No worker for model {entry.model!r} became free within the router queue's "
                f"{self.timeout:g} s (--queue-timeout).",
                code="queue_timeout",
                type="server_error",
                headers={"Retry-After": self._retry_after(q)},
            )
        entry.future.set_exception(err)

    def _drop(self, q: FairQueue, w: Waiter, why: str) -> None:
        """``w`` was evicted from the full queue (already out of it): answer it."""
        entry: _Entry = w.payload
        if entry.timer is not None:
            entry.timer.cancel()
        self._count(entry.model, w.tier, why)
        if why == "priority":
            err = ApiError(
                503,
                f"The request was shed from the full router queue of model {entry.model!r} for one of a "
                "higher priority (its key's tier is sheddable).",
                code="request_shed",
                type="server_error",
                headers={"Retry-After": self._retry_after(q)},
            )
        else:
            err = ApiError(
                429,
                f"The router queue for model {entry.model!r} is full and this key holds more of it than "
                "any other: its newest request gives way.",
                code="queue_full",
                headers={"Retry-After": self._retry_after(q)},
            )
        if not entry.future.done():
            entry.future.set_exception(err)

    def _deadline_error(self, model: str, deadline_ms: float | None, q: FairQueue) -> ApiError:
        return ApiError(
            429,
            f"The request's time-to-first-token deadline ({deadline_ms:g} ms) cannot be met: "
            f"model {model!r} has {len(q)} requests queued.",
            code="deadline_unreachable",
            headers={"Retry-After": self._retry_after(q)},
        )

    def _retry_after(self, q: FairQueue) -> str:
        drain = (len(q) + 1) * q.interval if q.interval is not None else 1.0
        return str(max(1, min(60, math.ceil(drain))))

    def _count(self, model: str, tier: int, reason: str) -> None:
        self.metrics.shed.child((model, tier_label(tier), reason)).value += 1.0

    # -- the slots' side ---------------------------------------------------------------------
    def pump(self, model: str | None = None) -> None:
        """Dispatch waiters while workers can take them (``model``: its queue, else all)."""
        if model is not None:
            q = self.queues.get(model)
            if q is not None and len(q):
                self._pump(model, q)
            return
        for m, q in list(self.queues.items()):
            if len(q):
                self._pump(m, q)

    def _pump(self, model: str, q: FairQueue) -> None:
        def place(w: Waiter) -> bool:
            entry: _Entry = w.payload
            try:
                if entry.take is not None:
                    ep = entry.take()
                else:
                    ep = self._take(entry.ctx, w.key, w.tier, w.weight, q)
            except OverloadedError:
                return False
            except ApiError as exc:  # the model lost its workers meanwhile
                self._settle(entry)
                if not entry.future.done():
                    entry.future.set_exception(exc)
                return True
            self._settle(entry)
            self.metrics.wait.child((model, tier_label(w.tier))).observe(self.clock() - w.arrived)
            self.metrics.served.child((model, w.key)).value += w.cost
            entry.future.set_result(ep)
            return True

        q.serve(self.clock(), place)

    @staticmethod
    def _settle(entry: _Entry) -> None:
        if entry.timer is not None:
            entry.timer.cancel()
            entry.timer = None

    def _ensure_recheck(self) -> None:
        if not self.recheck or (self._recheck_task is not None and not self._recheck_task.done()):
            return
        self._recheck_task = asyncio.get_running_loop().create_task(self._recheck())

    async def _recheck(self) -> None:
        while any(len(q) for q in self.queues.values()):
            if self.refresh is not None:
                self.refresh()
            await asyncio.sleep(RECHECK_S)
            self.pump()

    def close(self) -> None:
        if self._recheck_task is not None:
            self._recheck_task.cancel()


def _cached_tokens(index: KvIndexView, ctx: RequestContext) -> int:
    """Prompt tokens the best worker already holds (the KV index's longest prefix match)."""
    best = 0
    by_size: dict[int, list[Any]] = {}
    for view in index.views_by_key.values():
        by_size.setdefault(view.block_size, []).append(view)
    for size, views in by_size.items():
        hashes = ctx.cached_block_hashes(size, index.hash_prompt)
        if not hashes:
            continue
        matched = index.match(hashes, views)
        if matched:
            best = max(best, int(max(matched)) * size)
    return best
