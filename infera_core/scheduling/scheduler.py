"""The scheduler: candidates of the request's model → profile → one endpoint.

``schedule(ctx, exclude)`` only decides; sending is the transport's job, so other
profile handlers (PD: a prefill and a decode pick) can reuse it. Raises
:class:`NoWorkerError` (→ 503), :class:`UnknownModelError` (→ 404) or
:class:`OverloadedError` (→ 429) for the server to turn into HTTP errors.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from typing import Protocol

from infera_core.request import RequestContext
from infera_core.scheduling.arrays import ARRAY_MIN, state
from infera_core.scheduling.candidates import Candidates
from infera_core.scheduling.dp import DpRanks
from infera_core.scheduling.explain import explained_filter, explained_pick
from infera_core.scheduling.profile import Profile, build_profile
from infera_core.scheduling.registry import PolicyRegistry
from infera_core.scheduling.router_config import RouterConfig
from infera_core.scheduling.types import Endpoint, KvIndexView, RoutedEvent, SchedulerDeps

DIRECT_HEADER = "x-worker-instance-id"


class SchedulingError(Exception):
    """Base of the errors the scheduler reports to the route handler."""


class NoWorkerError(SchedulingError):
    """No routable worker for the model (all gone, draining or breaker open)."""


class UnknownModelError(SchedulingError):
    def __init__(self, model: str, available: Sequence[str]) -> None:
        self.model = model
        self.available = list(available)
        super().__init__(model)


class OverloadedError(SchedulingError):
    """Every candidate is at its admission cap."""


class CandidateSource(Protocol):
    def candidates(self, model: str) -> list[Endpoint]: ...

    def get(self, worker_id: str) -> Endpoint | None: ...

    def models(self) -> list[str]: ...


Observer = Callable[[str, float], None]


def under_cap(candidates: list[Endpoint], cap: int) -> list[Endpoint]:
    """The candidates with fewer than ``cap`` requests in flight (over the arrays when many):
    the router's count when the processes share one (:mod:`~infera_core.scheduling.shared_load`)."""
    arrays = state()
    shared = arrays.shared
    if len(candidates) < ARRAY_MIN:
        if shared is None:
            return [ep for ep in candidates if ep.in_flight < cap]
        q, n = shared.q, shared.processes
        first = -shared.index  # ep.load_word is this process's count: the slot's counts start there - index
        return [
            ep
            for ep in candidates
            if (ep.in_flight if (w := ep.load_word + first) < 0 else sum(q[w : w + n])) < cap
        ]
    cands = candidates if type(candidates) is Candidates else Candidates(candidates)
    rows = cands.rows
    keep = (arrays.in_flight[rows] if shared is None else shared.in_flight_rows(arrays, rows)) < cap
    return cands.subset(keep) if keep.any() else []


class Scheduler:
    """Routes with the model's profile (or the default one)."""

    __slots__ = (
        "_notify",
        "_observe",
        "default",
        "direct",
        "dp",
        "kv_usage_max",
        "max_inflight",
        "per_model",
        "source",
        "waiting_max",
    )

    def __init__(
        self,
        source: CandidateSource,
        default: Profile,
        per_model: dict[str, Profile] | None = None,
        *,
        direct: bool = False,
        max_inflight: int = 0,
        observe: Observer | None = None,
        notify: Callable[[RoutedEvent], None] | None = None,
        kv_index: KvIndexView | None = None,
    ) -> None:
        self.source = source
        self.default = default
        self.dp = DpRanks(kv_index)
        """Chooses the rank of a picked DP-attention endpoint (``X-Data-Parallel-Rank``)."""
        self.per_model = per_model or {}
        self.direct = direct
        self.max_inflight = max_inflight
        self.waiting_max = 0.0
        """A worker whose engine reports this many waiting requests is saturated (0: not checked)."""
        self.kv_usage_max = 0.0
        """A worker whose engine reports this KV-cache usage (0..1) is saturated (0: not checked)."""
        self._observe = observe
        self._notify = notify

    def profile_for(self, model: str) -> Profile:
        return self.per_model.get(model, self.default)

    def profile_of(self, ctx: RequestContext) -> Profile:
        """The request's profile: its model's, else (a LoRA adapter) its base model's, else the default."""
        profile = self.per_model.get(ctx.model)
        return profile if profile is not None else self.per_model.get(ctx.base_model, self.default)

    def schedule(
        self, ctx: RequestContext, exclude: Collection[str] = (), cap: int | None = None
    ) -> Endpoint:
        """``cap``: the in-flight cap for this request instead of ``max_inflight`` (the queue
        keeps headroom from sheddable requests)."""
        t0 = time.perf_counter()
        candidates = self.source.candidates(ctx.model)
        if not candidates:
            models = self.source.models()
            if models:
                raise UnknownModelError(ctx.model, models)
            raise NoWorkerError("no workers registered")
        profile = self.profile_of(ctx)
        rec = ctx.explain  # a Decision only when an explanation was asked for (explain.py)
        if rec is not None:
            rec.begin(ctx, profile.name)
        if exclude:
            before = candidates
            candidates = [ep for ep in candidates if ep.worker_id not in exclude]
            if rec is not None:
                rec.removed(before, candidates, "retry")
        candidates = (
            profile.filter(ctx, candidates) if rec is None else explained_filter(profile, ctx, candidates)
        )
        if not candidates:
            raise NoWorkerError(f"no routable worker for model {ctx.model!r}")
        if cap is None:
            cap = self.max_inflight
        if cap > 0:
            before = candidates
            candidates = under_cap(candidates, cap)
            if rec is not None:
                rec.removed(before, candidates, "in-flight-cap")
            if not candidates:
                raise OverloadedError(f"every worker for model {ctx.model!r} is at its in-flight cap ({cap})")
        if self.waiting_max > 0 or self.kv_usage_max > 0:
            candidates = [ep for ep in candidates if not self._saturated(ep)]
            if not candidates:
                raise OverloadedError(
                    f"every worker for model {ctx.model!r} is saturated (its engine's waiting queue or KV usage)"
                )
        # direct mode picks among the healthy workers under their cap, like the policy does
        chosen = self._direct(ctx, candidates) if self.direct else None
        if chosen is None:
            chosen = (
                profile.pick(ctx, candidates) if rec is None else explained_pick(profile, ctx, candidates)
            )
        elif rec is not None:
            rec.picked = chosen.worker_id
            rec.policy = "direct"
        chosen.picks += 1
        elapsed = time.perf_counter() - t0
        if self._observe is not None:
            self._observe(profile.name, elapsed)
        if self._notify is not None:
            self._notify(
                RoutedEvent(ctx.request_id, ctx.model, chosen.worker_id, None, profile.name, elapsed)
            )
        return chosen

    def _saturated(self, ep: Endpoint) -> bool:
        stats = ep.stats
        if not stats:
            return False
        waiting, kv = self.waiting_max, self.kv_usage_max
        return (waiting > 0 and stats.get("waiting", 0.0) >= waiting) or (
            kv > 0 and stats.get("kv_usage", 0.0) >= kv
        )

    def _direct(self, ctx: RequestContext, candidates: list[Endpoint]) -> Endpoint | None:
        wanted = ctx.headers.get(DIRECT_HEADER)
        if not wanted:
            return None
        for ep in candidates:
            if ep.worker_id == wanted and ep.record.routable:
                return ep
        return None

    def finished(self, ctx: RequestContext, endpoint: Endpoint, ok: bool) -> None:
        self.profile_of(ctx).finished(ctx, endpoint, ok)

    def first_token(self, ctx: RequestContext, endpoint: Endpoint) -> None:
        """The first token from ``endpoint`` reached the router (:meth:`Scorer.on_first_token`)."""
        self.profile_of(ctx).first_token(ctx, endpoint)

    def timing(self, ctx: RequestContext, endpoint: Endpoint, since_first: float, itl: float | None) -> None:
        """A stream's timing, for scorers that learn latency (:meth:`Scorer.on_timing`)."""
        self.profile_of(ctx).timing(ctx, endpoint, since_first, itl)


def build_scheduler(
    source: CandidateSource,
    config: RouterConfig,
    registry: PolicyRegistry,
    deps: SchedulerDeps,
    *,
    direct: bool = False,
    max_inflight: int = 0,
    observe: Observer | None = None,
    notify: Callable[[RoutedEvent], None] | None = None,
) -> Scheduler:
    """Build every profile once (config errors surface here, at start-up)."""
    label, profile_cfg = config.resolve(registry, "router")
    default = build_profile(label, profile_cfg, registry, deps)
    per_model: dict[str, Profile] = {}
    for model, choice in config.models.items():
        if not choice.has_profile:
            continue  # only other settings (migration_limit): the default profile
        mlabel, mcfg = choice.resolve(registry, f"router models.{model}")
        per_model[model] = build_profile(mlabel, mcfg, registry, deps, f"router models.{model}")
    return Scheduler(
        source,
        default,
        per_model,
        direct=direct,
        max_inflight=max_inflight,
        observe=observe,
        notify=notify,
        kv_index=deps.kv_index,
    )
