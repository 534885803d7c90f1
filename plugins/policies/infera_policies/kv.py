"""KV-cache-aware policies: ``kv-overlap``, ``load``, ``recent-dispatch``, ``cache-fill``, ``imbalance-guard``.

The ``kv-aware`` preset combines them. For each candidate worker *w* (after the
``health``/``role`` filters and the imbalance guard) the picker maximizes::

    score(w) = 1.0 · overlap(w) + 0.1 · (1 − load(w) / max load)
             + 0.1 · (1 − fill(w) / max fill) + 0.02 · (1 − recent(w) / max recent)

* ``overlap(w)`` — tier-weighted fraction of the prompt's full blocks cached on *w*
  (longest prefix, from the KV index; a block on CPU counts 0.5, on disk 0.25), or
  shared with a request still in flight on *w* (its blocks are being computed there
  and stay held until it ends; KV events only report them later) or that ended well
  there less than 2 s ago (its events may still be on the way), whichever is longer;
* ``load(w)`` — ``in_flight(w) + in_flight_prompt_tokens(w) / 4096 + waiting(w)``
  (the router's own accounting; ``waiting`` from the engine's ``/metrics`` when scraped);
* ``fill(w)`` — prompt tokens sent to *w* that its cache did not hold, decayed by half
  every 128 dispatches: new blocks evict *w*'s least recently used ones, so a prompt
  nobody holds goes where the cache turned over least lately (the fleet then evicts
  its oldest blocks, as one cache the fleet's size would), which also spreads prefill;
* ``recent(w)`` — dispatches to *w*, decayed by half every 32 dispatches of this
  server (so paced traffic, which never builds up in-flight load, still spreads);
* the **imbalance guard** first drops workers whose pressure
  ``in_flight + recent`` exceeds ``1.2 × mean + 4``, or the least pressured worker's
  pressure ``+ 16`` (so no worker idles while others share a hot prefix) — never all,
  so a prefix every request shares (one system prompt) cannot pull all traffic to
  one worker: once it is over the bar, the others get requests and cache it too.

A cached prefix of 22% of the prompt is worth more than an idle, unfilled worker: the
guard, not the scores, keeps the load balanced (``bench/fleet/saturation.py``).
PD presets: ``kv-aware-prefill`` is strongly cache-seeking (load 0.15),
``kv-aware-decode`` mostly load (overlap 0.2, load 1.0). See ``docs/explanation/kv-routing.md``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from infera_core.request import RequestContext
from infera_core.scheduling.arrays import ARRAY_MIN, Floats, Rows, relative_inverse, state
from infera_core.scheduling.candidates import Candidates, rows_of
from infera_core.scheduling.config import PluginRef, ProfileConfig, ScorerRef
from infera_core.scheduling.dp import best_rank_overlap
from infera_core.scheduling.registry import PolicyRegistry
from infera_core.scheduling.types import Endpoint, Filter, KvIndexView, PolicyFactory, SchedulerDeps, Scorer
from infera_policies.in_flight import InFlightPrefixes

BASE_FILTERS = [PluginRef(name="health"), PluginRef(name="role")]
CLOCK_KEY = "infera_policies.dispatch_clock"
FILL_CLOCK_KEY = "infera_policies.fill_clock"
IN_FLIGHT_KEY = "infera_policies.in_flight_prefixes"


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


class OverlapParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpu: float = Field(1.0, ge=0, le=1, description="Credit of a cached block in GPU memory.")
    cpu: float = Field(0.5, ge=0, le=1, description="Credit of a block offloaded to CPU memory.")
    disk: float = Field(0.25, ge=0, le=1, description="Credit of a block on disk / external storage.")
    pending: bool = Field(
        True,
        description="Count the prompts of requests still in flight on a worker as cached there "
        "(their blocks are being computed and stay held until the request ends; KV events come later).",
    )
    linger: float = Field(
        2.0,
        ge=0,
        le=60,
        description="Seconds a prompt stays credited where it ran after its request ended well, while the "
        "worker's KV events for it are still on the way (a lagging event plane); 0: until it ends.",
    )


class KvOverlapScorer(Scorer):
    """Fraction of the prompt's full blocks already cached on the worker (longest prefix, tier-weighted)."""

    name = "kv-overlap"
    needs_tokens = True
    __slots__ = ("_bsize", "_key", "_slot", "in_flight", "index", "linger", "pending", "weights")

    def __init__(
        self,
        index: KvIndexView | None,
        params: OverlapParams | None = None,
        in_flight: InFlightPrefixes | None = None,
    ) -> None:
        p = params or OverlapParams()
        self.index = index
        self.weights = (p.gpu, p.cpu, p.disk)
        self.pending = p.pending
        self.linger = p.linger
        self.in_flight = in_flight if in_flight is not None else InFlightPrefixes()
        self._key: object = None
        self._slot: Rows = np.zeros(0, np.int64)
        """row → view slot (-1: none or not credited, -2: not resolved yet)."""
        self._bsize: Rows = np.zeros(0, np.int64)

    def score(self, ctx: RequestContext, candidates: Sequence[Endpoint]) -> list[float]:
        out = self._prefix_scores(ctx, candidates)
        if self.index is not None and self.index.ranked_workers:  # DP-attention servers: best rank
            best_rank_overlap(self.index, ctx, candidates, self.weights, out)
        if self.pending and self.in_flight.pending:
            depth = self.in_flight.depth(ctx, self.index)
            if depth:
                out = [max(o, depth.get(ep.row, 0.0)) for o, ep in zip(out, candidates, strict=True)]
        self.in_flight.last = (ctx.request_id, [ep.row for ep in candidates], out)
        return out

    def _prefix_scores(self, ctx: RequestContext, candidates: Sequence[Endpoint]) -> list[float]:
        index = self.index
        if index is None or not ctx.token_ids:
            return [0.0] * len(candidates)
        get = index.views_by_key.get
        views = [get((ep.worker_id, ep.dp_rank)) for ep in candidates]
        untrusted = index.untrusted
        if untrusted:
            views = [None if v is None or v.worker_id in untrusted else v for v in views]
        sizes = {v.block_size for v in views if v is not None}
        out = [0.0] * len(candidates)
        for bs in sizes:  # almost always one block size for the whole fleet
            hashes = ctx.cached_block_hashes(bs, index.hash_prompt)
            if not hashes:
                continue
            n = len(hashes)
            if len(sizes) == 1:  # views that are None match 0.0
                return [m / n for m in index.match(hashes, views, self.weights)]
            group = [v if v is not None and v.block_size == bs else None for v in views]
            for i, m in enumerate(index.match(hashes, group, self.weights)):
                if group[i] is not None:
                    out[i] = m / n
        return out

    def score_rows(self, ctx: RequestContext, candidates: Sequence[Endpoint]) -> Floats:
        """:meth:`score` over arrays: each row's view slot is remembered until the index's views change."""
        out = self._prefix_rows(ctx, candidates)
        if self.index is not None and self.index.ranked_workers:  # DP-attention servers: best rank
            best_rank_overlap(self.index, ctx, candidates, self.weights, out)
        if self.pending and self.in_flight.pending:
            depth = self.in_flight.depth(ctx, self.index)
            if depth:
                by_row = np.zeros(state().size, np.float64)
                by_row[list(depth)] = list(depth.values())
                out = np.maximum(out, by_row[rows_of(candidates)])
        self.in_flight.last = (ctx.request_id, rows_of(candidates), out)
        return out

    def _prefix_rows(self, ctx: RequestContext, candidates: Sequence[Endpoint]) -> Floats:
        index = self.index
        n_c = len(candidates)
        if index is None or not ctx.token_ids:
            return np.zeros(n_c, np.float64)
        rows = rows_of(candidates)
        slots, sizes = self._slots_for(index, rows, candidates)
        known = sizes[slots >= 0]
        if not len(known):
            return np.zeros(n_c, np.float64)
        bs = int(known[0])
        if (known != bs).any():  # several block sizes in one fleet: the general path
            return np.asarray(self.score(ctx, candidates), np.float64)
        hashes = ctx.cached_block_hashes(bs, index.hash_prompt)
        if not hashes:
            return np.zeros(n_c, np.float64)
        matched = index.match_slots(hashes, slots, self.weights)
        return matched / len(hashes)  # type: ignore[no-any-return]

    def _slots_for(self, index: KvIndexView, rows: Rows, candidates: Sequence[Endpoint]) -> tuple[Rows, Rows]:
        untrusted = index.untrusted
        key = (index.version, state().generation, frozenset(untrusted) if untrusted else None)
        if key != self._key or len(self._slot) < state().size:
            self._key = key
            self._slot = np.full(max(64, 2 * state().size), -2, np.int64)
            self._bsize = np.zeros(len(self._slot), np.int64)
        slots = self._slot[rows]
        unresolved = slots == -2
        if unresolved.any():  # resolve rows not seen since the views last changed
            get = index.views_by_key.get
            for i in np.flatnonzero(unresolved).tolist():
                ep = candidates[i]
                view = get((ep.worker_id, ep.dp_rank))
                slot = -1 if view is None or view.worker_id in untrusted else view.slot
                self._slot[ep.row] = slot
                self._bsize[ep.row] = view.block_size if view is not None else 0
            slots = self._slot[rows]
        return slots, self._bsize[rows]

    def on_routed(self, ctx: RequestContext, endpoint: Endpoint) -> None:
        index = self.index
        if index is None:
            return
        index.routed_at[endpoint.worker_id] = time.time()
        if self.pending and ctx.token_ids:
            view = index.views_by_key.get((endpoint.worker_id, endpoint.dp_rank))
            if view is not None:
                self.in_flight.add(
                    ctx,
                    endpoint,
                    ctx.cached_block_hashes(view.block_size, index.hash_prompt),
                    view.block_size,
                )

    def on_finished(self, ctx: RequestContext, endpoint: Endpoint, ok: bool) -> None:
        self.in_flight.remove(ctx, endpoint, ok, self.linger)


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

    def score_rows(self, ctx: RequestContext, candidates: Sequence[Endpoint]) -> Floats:
        """:meth:`score` over the arrays."""
        st, rows = state(), rows_of(candidates)
        load = st.in_flight[rows] + st.prompt_tokens[rows] / self.unit
        if self.engine_stats:
            load = load + st.waiting[rows]
        return relative_inverse(load)

    def on_routed(self, ctx: RequestContext, endpoint: Endpoint) -> None:
        n = len(ctx.token_ids) if ctx.token_ids else _estimate_tokens(ctx.body)
        key = (ctx.request_id, endpoint.worker_id)
        endpoint.in_flight_prompt_tokens += n - self._pending.get(key, 0)
        self._pending[key] = n

    def on_finished(self, ctx: RequestContext, endpoint: Endpoint, ok: bool) -> None:
        n = self._pending.pop((ctx.request_id, endpoint.worker_id), 0)
        endpoint.in_flight_prompt_tokens = max(0, endpoint.in_flight_prompt_tokens - n)


def _estimate_tokens(body: dict[str, Any]) -> int:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return len(prompt) // 4
    messages = body.get("messages")
    if isinstance(messages, list):
        return sum(len(str(m.get("content", ""))) for m in messages if isinstance(m, dict)) // 4
    return 0


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


class FillParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    half_life: float = Field(
        128.0, gt=0, description="Dispatches (of this server) after which sent uncached tokens weigh half."
    )


class CacheFillScorer(Scorer):
    """1 for the worker whose cache took the fewest new blocks lately (uncached prompt tokens sent, decayed).

    Each routed request adds the prompt tokens the chosen worker did not hold on GPU (from
    the KV index) to that worker's count, decayed by half every ``half_life`` dispatches.
    Every worker's cache evicts its least recently used blocks, so sending the next
    uncached prompt to the worker that filled least lately evicts the oldest blocks of the
    whole fleet — as one cache the size of the fleet would — and spreads prefill work.
    """

    name = "cache-fill"
    needs_tokens = True
    __slots__ = ("clock", "in_flight", "index")

    def __init__(
        self, index: KvIndexView | None, clock: DispatchClock, in_flight: InFlightPrefixes | None = None
    ) -> None:
        self.index = index
        self.clock = clock
        self.in_flight = in_flight

    # ``fill`` holds each count scaled by factor ** -(n - base) at this clock's dispatch n:
    # decaying every row is then a common factor, which ``relative_inverse`` ignores (no
    # per-request exp over the rows); ``base`` moves up before the scale could overflow.

    def score(self, ctx: RequestContext, candidates: Sequence[Endpoint]) -> list[float]:
        return relative_inverse(state().fill[rows_of(candidates)]).tolist()  # type: ignore[no-any-return]

    def score_rows(self, ctx: RequestContext, candidates: Sequence[Endpoint]) -> Floats:
        """:meth:`score` over the arrays."""
        return relative_inverse(state().fill[rows_of(candidates)])

    def on_routed(self, ctx: RequestContext, endpoint: Endpoint) -> None:
        ids = ctx.token_ids
        n = len(ids) if ids else _estimate_tokens(ctx.body)
        index = self.index
        last = self.in_flight.last if self.in_flight is not None else None
        if ids and last is not None and last[0] == ctx.request_id:  # kv-overlap scored it: reuse
            rows, overlap = last[1], last[2]
            at = np.flatnonzero(np.asarray(rows) == endpoint.row)
            if len(at):
                n = round(n * (1.0 - float(overlap[int(at[0])])))
                index = None
        if ids and index is not None:
            view = index.views_by_key.get((endpoint.worker_id, endpoint.dp_rank))
            if view is not None and view.worker_id not in index.untrusted:
                hashes = ctx.cached_block_hashes(view.block_size, index.hash_prompt)
                if hashes:
                    n -= int(index.match(hashes, [view], (1.0, 0.0, 0.0))[0]) * view.block_size
        st, clock = state(), self.clock
        clock.n += 1
        age = clock.n - clock.base
        if age > 60 * clock.half_life:  # the scale would pass 2 ** 60: fold it into the counts
            st.fill *= clock.factor**age
            clock.base, age = clock.n, 0
        st.fill[endpoint.row] += max(0, n) * clock.factor**-age


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


def kv_profile(
    overlap: float, load: float, recent: float, factor: float, gap: float = 8.0, fill: float = 0.0
) -> ProfileConfig:
    guard: dict[str, float] = {"factor": factor} if gap == 8.0 else {"factor": factor, "gap": gap}
    scorers = [
        ScorerRef(name="kv-overlap", weight=overlap),
        ScorerRef(name="load", weight=load),
        ScorerRef(name="recent-dispatch", weight=recent),
    ]
    if fill:
        scorers.append(ScorerRef(name="cache-fill", weight=fill))
    return ProfileConfig(
        filters=[*BASE_FILTERS, PluginRef(name="imbalance-guard", params=guard)],
        scorers=scorers,
        picker=PluginRef(name="max-score"),
    )


def register_kv(registry: PolicyRegistry) -> None:
    """Add the KV-aware scorers, the imbalance guard and the ``kv-aware*`` presets."""

    def in_flight(d: SchedulerDeps) -> InFlightPrefixes:
        shared = d.extra.get(IN_FLIGHT_KEY)
        if not isinstance(shared, InFlightPrefixes):
            shared = d.extra[IN_FLIGHT_KEY] = InFlightPrefixes(d.clock)
        return shared

    def overlap(p: Any, d: SchedulerDeps) -> Scorer:
        return KvOverlapScorer(d.kv_index, p, in_flight(d))

    def recent(p: Any, d: SchedulerDeps) -> Scorer:
        clock = dispatch_clock(d)
        if isinstance(p, RecentParams):
            clock.half_life = p.half_life
            clock.factor = 0.5 ** (1.0 / p.half_life)
        return RecentDispatchScorer(clock)

    def guard(p: Any, d: SchedulerDeps) -> Filter:
        return ImbalanceGuard(dispatch_clock(d), p)

    def fill(p: Any, d: SchedulerDeps) -> Scorer:
        clock = d.extra.get(FILL_CLOCK_KEY)
        if not isinstance(clock, DispatchClock):
            clock = d.extra[FILL_CLOCK_KEY] = DispatchClock(FillParams().half_life)
        if isinstance(p, FillParams):
            clock.half_life = p.half_life
            clock.factor = 0.5 ** (1.0 / p.half_life)
        return CacheFillScorer(d.kv_index, clock, in_flight(d))

    registry.add(PolicyFactory("kv-overlap", "scorer", overlap, OverlapParams, KvOverlapScorer.__doc__ or ""))
    registry.add(
        PolicyFactory("load", "scorer", lambda p, d: LoadScorer(p), LoadParams, LoadScorer.__doc__ or "")
    )
    registry.add(
        PolicyFactory("recent-dispatch", "scorer", recent, RecentParams, RecentDispatchScorer.__doc__ or "")
    )
    registry.add(PolicyFactory("imbalance-guard", "filter", guard, GuardParams, ImbalanceGuard.__doc__ or ""))
    registry.add(PolicyFactory("cache-fill", "scorer", fill, FillParams, CacheFillScorer.__doc__ or ""))
    registry.add_preset(
        "kv-aware",
        kv_profile(1.0, 0.1, 0.02, 1.2, 16.0, fill=0.1),
        "Cache-aware: longest cached prefix (KV events) traded against load, with an imbalance guard.",
    )
    registry.add_preset(
        "kv-aware-prefill",
        kv_profile(1.0, 0.15, 0.05, 2.0),
        "PD prefill side: strongly cache-seeking.",
    )
    registry.add_preset(
        "kv-aware-decode",
        kv_profile(0.2, 1.0, 0.3, 1.3),
        "PD decode side: mostly load, a little cache affinity.",
    )
