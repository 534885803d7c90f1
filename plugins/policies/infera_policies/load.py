"""Load-balancing policies: ``load``, ``recent-dispatch`` and the ``imbalance-guard`` filter.

They weigh what the router itself counted (requests and prompt tokens in flight, recent
dispatches against a :class:`DispatchClock`), never the KV index; the ``kv-aware`` presets
(:mod:`infera_policies.kv`) trade them against cache overlap.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from infera_core.request import RequestContext
from infera_core.scheduling.arrays import ARRAY_MIN, Floats, Rows, relative_inverse, state
from infera_core.scheduling.candidates import Candidates, rows_of
from infera_core.scheduling.types import Endpoint, Filter, SchedulerDeps, Scorer

CLOCK_KEY = "infera_policies.dispatch_clock"


class DispatchClock:
    """Counts this server's dispatches; ``Endpoint.recent_dispatch`` decays against it.

    ``Endpoint.recent_dispatch_ts`` holds the clock value at the endpoint's last update.
    Shared by every profile through ``SchedulerDeps.extra``.
    """

    __slots__ = ("_all", "_key", "base", "factor", "half_life", "n")

    def __init__(self, half_life: float = 32.0) -> None:
        self._key: object = None
        self._all: Floats = np.zeros(0, np.float64)
        self.n = 0
        self.base = 0
        """Dispatch at which ``cache-fill``'s scaled counts are unscaled."""
        self.half_life = half_life
        self.factor = 0.5 ** (1.0 / half_life)

    def recent(self, ep: Endpoint) -> float:
        age = self.n - ep.recent_dispatch_ts
        return ep.recent_dispatch * self.factor**age if age else ep.recent_dispatch

    def recent_all(self, endpoints: Sequence[Endpoint]) -> list[float]:
        """:meth:`recent` of each endpoint (one pass; the scorer and the guard call it per request)."""
        n, f = self.n, self.factor
        return [ep.recent_dispatch * f ** (n - ep.recent_dispatch_ts) for ep in endpoints]

    def recent_rows(self, rows: Rows) -> Floats:
        """:meth:`recent_all` over the arrays, for endpoint ``rows``."""
        st = state()
        key = (self.n, self.factor, st.recent_writes, len(st.recent))
        if key != self._key:  # once per dispatch, for every row: the guard and the scorer share it
            # factor ** age as exp(age · ln factor): a vector exp, several times faster than a vector pow
            self._all = st.recent * np.exp((self.n - st.recent_ts) * math.log(self.factor))
            self._key = key
        return self._all[rows]

    def dispatched(self, ep: Endpoint) -> None:
        ep.recent_dispatch = self.recent(ep) + 1.0
        self.n += 1
        ep.recent_dispatch_ts = self.n


def dispatch_clock(deps: SchedulerDeps) -> DispatchClock:
    clock = deps.extra.get(CLOCK_KEY)
    if not isinstance(clock, DispatchClock):
        clock = deps.extra[CLOCK_KEY] = DispatchClock()
    return clock


def _relative_inverse(values: Sequence[float]) -> list[float]:
    """1 for the lowest, falling to 0 at the highest (all 1 when all are zero)."""
    top = max(values) if values else 0.0
    if top <= 0:
        return [1.0] * len(values)
    return [1.0 - v / top for v in values]


class LoadParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tokens_per_request: float = Field(
        4096.0, gt=0, description="In-flight prompt tokens that weigh as much as one in-flight request."
    )
    engine_stats: bool = Field(
        True, description="Add the engine's waiting requests when /metrics is scraped."
    )


class LoadScorer(Scorer):
    """1 for the least loaded worker: in-flight requests + in-flight prompt tokens (+ engine queue)."""

    name = "load"
    __slots__ = ("_pending", "engine_stats", "unit")

    def __init__(self, params: LoadParams | None = None) -> None:
        p = params or LoadParams()
        self.unit = p.tokens_per_request
        self.engine_stats = p.engine_stats
        self._pending: dict[tuple[str, str], int] = {}
        """(request id, worker id) → prompt tokens added to that endpoint's accounting."""

    def score(self, ctx: RequestContext, candidates: Sequence[Endpoint]) -> list[float]:
        unit = self.unit  # one comprehension: this runs per candidate per request
        if self.engine_stats:
            return _relative_inverse(
                [
                    ep.in_flight
                    + ep.in_flight_prompt_tokens / unit
                    + (ep.stats.get("waiting", 0.0) if ep.stats else 0.0)
                    for ep in candidates
                ]
            )
        return _relative_inverse([ep.in_flight + ep.in_flight_prompt_tokens / unit for ep in candidates])

    def explain(
        self, ctx: RequestContext, candidates: Sequence[Endpoint], scores: Sequence[float]
    ) -> list[dict[str, Any]]:
        """The load terms: requests and prompt tokens in flight, the engine's queue."""
        return [
            {
                "in_flight": ep.in_flight,
                "in_flight_prompt_tokens": ep.in_flight_prompt_tokens,
                "waiting": ep.stats.get("waiting", 0.0) if self.engine_stats and ep.stats else 0.0,
            }
            for ep in candidates
        ]

    def score_rows(self, ctx: RequestContext, candidates: Sequence[Endpoint]) -> Floats:
        """:meth:`score` over the arrays."""
        st, rows = state(), rows_of(candidates)
        load = st.in_flight[rows] + st.prompt_tokens[rows] / self.unit
        if self.engine_stats:
            load = load + st.waiting[rows]
        return relative_inverse(load)

    def on_routed(self, ctx: RequestContext, endpoint: Endpoint) -> None:
        n = ctx.prompt_tokens()
        key = (ctx.request_id, endpoint.worker_id)
        endpoint.in_flight_prompt_tokens += n - self._pending.get(key, 0)
        self._pending[key] = n

    def on_finished(self, ctx: RequestContext, endpoint: Endpoint, ok: bool) -> None:
        n = self._pending.pop((ctx.request_id, endpoint.worker_id), 0)
        endpoint.in_flight_prompt_tokens = max(0, endpoint.in_flight_prompt_tokens - n)


class RecentParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    half_life: float = Field(
        32.0, gt=0, description="Dispatches (of this server) after which a pick weighs half."
    )


class RecentDispatchScorer(Scorer):
    """1 for the worker that received the fewest recent requests (decayed per dispatch)."""

    name = "recent-dispatch"
    __slots__ = ("clock",)

    def __init__(self, clock: DispatchClock) -> None:
        self.clock = clock

    def score(self, ctx: RequestContext, candidates: Sequence[Endpoint]) -> list[float]:
        return _relative_inverse(self.clock.recent_all(candidates))

    def score_rows(self, ctx: RequestContext, candidates: Sequence[Endpoint]) -> Floats:
        """:meth:`score` over the arrays."""
        return relative_inverse(self.clock.recent_rows(rows_of(candidates)))

    def on_routed(self, ctx: RequestContext, endpoint: Endpoint) -> None:
        self.clock.dispatched(endpoint)


class GuardParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    factor: float = Field(1.5, ge=1.0, description="Exclude workers above factor × mean pressure (+ slack).")
    slack: float = Field(4.0, ge=0, description="Absolute headroom so low-load noise excludes nobody.")
    gap: float = Field(
        8.0, gt=0, description="Also exclude workers this far above the least pressured one (no idle worker)."
    )


class ImbalanceGuard(Filter):
    """Drops workers whose pressure (in-flight + recent dispatches) exceeds factor × mean + slack or min + gap."""

    name = "imbalance-guard"
    __slots__ = ("array_min", "clock", "factor", "gap", "slack")

    def __init__(self, clock: DispatchClock, params: GuardParams | None = None) -> None:
        p = params or GuardParams()
        self.clock = clock
        self.factor = p.factor
        self.slack = p.slack
        self.gap = p.gap
        self.array_min = ARRAY_MIN
        """Candidates from which the array path is taken (tests set 0 or a huge number)."""

    def filter(self, ctx: RequestContext, candidates: list[Endpoint]) -> list[Endpoint]:
        if len(candidates) < 2:
            return candidates
        if len(candidates) >= self.array_min:
            return self._filter_rows(candidates)
        pressure = [
            ep.in_flight + r for ep, r in zip(candidates, self.clock.recent_all(candidates), strict=True)
        ]
        bar = min(self.factor * (sum(pressure) / len(pressure)) + self.slack, min(pressure) + self.gap)
        kept = [ep for ep, p in zip(candidates, pressure, strict=True) if p <= bar]
        return kept or candidates

    def _filter_rows(self, candidates: list[Endpoint]) -> list[Endpoint]:
        """:meth:`filter` over the arrays (same bar: the mean summed in order, as Python does)."""
        cands = candidates if type(candidates) is Candidates else Candidates(candidates)
        rows = cands.rows
        pressure = state().in_flight[rows] + self.clock.recent_rows(rows)
        mean = float(pressure.sum()) / len(pressure)
        bar = min(self.factor * mean + self.slack, float(pressure.min()) + self.gap)
        keep = pressure <= bar
        return cands.subset(keep) if keep.any() else candidates
