"""KV-cache-aware policies: ``kv-overlap``, ``load``, ``recent-dispatch``, ``cache-fill``, ``imbalance-guard``.

The KV-index ones (``kv-overlap``, ``cache-fill``) live here; the load-balancing ones
(``load``, ``recent-dispatch``, ``imbalance-guard``) in :mod:`infera_policies.load`.

The ``kv-aware`` preset combines them. For each candidate worker *w* (after the
``health``/``role`` filters and the imbalance guard) the picker maximizes::

    score(w) = 1.0 · overlap(w) + 0.1 · (1 − load(w) / max load)
             + 0.1 · (1 − fill(w) / max fill) + 0.02 · (1 − recent(w) / max recent)
             + 0.3 · session(w)

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
* ``session(w)`` — 1 for the worker the request's conversation (session header,
  ``prompt_cache_key``, ``user``) was last routed to (:mod:`infera_policies.session`): worth
  more than the load terms together, less than a clearly longer cached prefix elsewhere;
* the **imbalance guard** first drops workers whose pressure
  ``in_flight + recent`` exceeds ``1.2 × mean + 4``, or the least pressured worker's
  pressure ``+ 16`` (so no worker idles while others share a hot prefix) — never all,
  so a prefix every request shares (one system prompt) cannot pull all traffic to
  one worker: once it is over the bar, the others get requests and cache it too.

A cached prefix of 22% of the prompt is worth more than an idle, unfilled worker: the
guard, not the scores, keeps the load balanced (``bench/fleet/saturation.py``).
A request without token ids (no routing tokenizer for its model) scores ``overlap(w)``
from its text instead: the ``approximate-prefix`` scorer (``untokenized_only``), a prefix
tree of this server's own decisions — the *text* routing mode, reported once per model.
PD presets: ``kv-aware-prefill`` is strongly cache-seeking (load 0.15),
``kv-aware-decode`` mostly load (overlap 0.2, load 1.0). See ``docs/explanation/kv-routing.md``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from infera_core.request import RequestContext
from infera_core.scheduling.arrays import Floats, Rows, relative_inverse, state
from infera_core.scheduling.candidates import rows_of
from infera_core.scheduling.config import PluginRef, ProfileConfig, ScorerRef
from infera_core.scheduling.dp import best_rank_overlap
from infera_core.scheduling.registry import PolicyRegistry
from infera_core.scheduling.types import Endpoint, Filter, KvIndexView, PolicyFactory, SchedulerDeps, Scorer
from infera_policies.approx_prefix import register_approx_prefix_scorer
from infera_policies.in_flight import InFlightPrefixes
from infera_policies.load import (
    DispatchClock,
    GuardParams,
    ImbalanceGuard,
    LoadParams,
    LoadScorer,
    RecentDispatchScorer,
    RecentParams,
    dispatch_clock,
)
from infera_policies.session import register_session

BASE_FILTERS = [PluginRef(name="health"), PluginRef(name="role")]
FILL_CLOCK_KEY = "infera_policies.fill_clock"
IN_FLIGHT_KEY = "infera_policies.in_flight_prefixes"


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

    def explain(
        self, ctx: RequestContext, candidates: Sequence[Endpoint], scores: Sequence[float]
    ) -> list[dict[str, Any]]:
        """Per candidate: the prompt's full blocks and how many of them count as cached there."""
        index = self.index
        get = index.views_by_key.get if index is not None else None
        out: list[dict[str, Any]] = []
        for ep, s in zip(candidates, scores, strict=True):
            view = get((ep.worker_id, ep.dp_rank)) if get is not None else None
            blocks = 0
            if view is not None and index is not None and ctx.token_ids:
                blocks = len(ctx.cached_block_hashes(view.block_size, index.hash_prompt))
            out.append({"overlap_blocks": round(s * blocks, 2), "prompt_blocks": blocks})
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
        n = len(ids) if ids else ctx.prompt_tokens()
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


def kv_profile(
    overlap: float,
    load: float,
    recent: float,
    factor: float,
    gap: float = 8.0,
    fill: float = 0.0,
    session: float = 0.0,
) -> ProfileConfig:
    guard: dict[str, float] = {"factor": factor} if gap == 8.0 else {"factor": factor, "gap": gap}
    scorers = [
        ScorerRef(name="kv-overlap", weight=overlap),
        # without a routing tokenizer for the model: by text prefix, not by load only
        ScorerRef(name="approximate-prefix", weight=overlap, params={"untokenized_only": True}),
        ScorerRef(name="load", weight=load),
        ScorerRef(name="recent-dispatch", weight=recent),
    ]
    if fill:
        scorers.append(ScorerRef(name="cache-fill", weight=fill))
    if session:  # infera_policies.session: a conversation stays where it ran (the guard still moves it)
        scorers.append(ScorerRef(name="session-affinity", weight=session))
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
    register_approx_prefix_scorer(registry)  # the presets' text fallback
    register_session(registry)  # the presets' session term
    registry.add_preset(
        "kv-aware",
        kv_profile(1.0, 0.1, 0.02, 1.2, 16.0, fill=0.1, session=0.3),
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
