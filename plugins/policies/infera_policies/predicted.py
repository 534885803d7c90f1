"""The ``predicted-latency`` scorer: route by each worker's predicted TTFT (and TPOT), learned online.

For every worker the scorer keeps a small model fitted in-process from what the router sees,
with no sidecar and no engine change:

* a **prefill queue**: each request routed to *w* adds its uncached prompt tokens (the prompt
  minus the prefix the KV index says *w* holds) to *w*'s queue, which drains at *w*'s prefill
  rate: ``busy(w)`` is when it is predicted to be empty. A request's predicted TTFT on *w* is
  ``max(0, busy(w) − now) + uncached(w) / rate(w)`` (+ ``q(w)`` when *w*'s queue is not empty).
  When a request's first token comes back the queue is moved by the difference between when it
  came and when it was predicted, so errors (a busy engine, requests from another router) do
  not pile up;
* the **queued-behind term** ``q(w)``: how much later than the queue model the requests routed
  behind others on *w* got their first token (an engine answers a prompt at the end of the step
  that finishes it, with the prompts batched after it, or holds prompts back while its KV memory
  is full), a mean with the same forgetting and ``QUEUE_PRIOR_N`` pseudo-observations of 0;
* the **prefill rate**: uncached tokens over service time (first token − the later of the
  request's routing and the previous first token on *w*: the worker's busy time for it),
  summed with exponential forgetting in time (``half_life`` seconds), so a worker whose speed
  changes is re-learned within a few half-lives. Until a worker has ``min_observations`` (its
  decayed count) its rate leans on the prior: the fleet's median learned rate, or
  ``prior_tokens_per_s`` before any is learned;
* the **TPOT**: the mean inter-chunk gap of its streams against the batch it ran in (requests
  in flight on *w*), a line fitted with the same forgetting (prior ``prior_itl_ms``, flat).

Scores (in ``[0, 1]``): without targets ``exp(−(predicted TTFT − best) / scale_s)`` (seconds:
the KV hit each worker would give is in its prediction, so cache affinity and speed trade in one
unit), or without ``scale_s`` ``(best + slack) / (predicted TTFT + slack)`` (slack 30 ms). A
request with targets (``X-Infera-TTFT-Target-Ms`` / ``X-Infera-TPOT-Target-Ms`` headers, or
its API key's ``ttft_target_ms`` / ``tpot_target_ms``) scores the workers predicted to meet
both above every one that is not (among them, the faster TTFT first); when none meets them,
the least violating (the largest predicted/target ratio, smallest) wins. A small
``exploration`` share of requests goes to a random worker among those (the whole set when
none meets the targets), so a worker the model misjudges gets measured again.

CPU per decision is a few numpy operations over the candidates' rows (no Python loop over
workers); the KV overlap is ``kv-overlap``'s when it scored the request just before, the backlog
``predicted-guard``'s when it filtered the request just before, and the columns are read as views
when the rows are one ascending run.
"""

from __future__ import annotations

import math
import random
import time
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from infera_core.request import RequestContext
from infera_core.scheduling.arrays import Floats, Rows, predicted_ttft, state
from infera_core.scheduling.candidates import rows_of
from infera_core.scheduling.config import PluginRef, ProfileConfig, ScorerRef
from infera_core.scheduling.registry import PolicyRegistry
from infera_core.scheduling.types import (
    TPOT_TARGET_HEADER,
    TTFT_TARGET_HEADER,
    Endpoint,
    Filter,
    KvIndexView,
    LatencyStats,
    PolicyFactory,
    SchedulerDeps,
    Scorer,
)
from infera_policies.in_flight import InFlightPrefixes
from infera_policies.kv import BASE_FILTERS, IN_FLIGHT_KEY, kv_profile
from infera_policies.predicted_busy import LatestBusy
from infera_policies.predicted_guard import PREDICTOR_KEY, PredictedGuard, PredictedGuardParams
from infera_policies.predicted_params import (
    COLUMNS,
    MIN_RATE,
    PRIOR_EVERY,
    QUEUE_PRIOR_N,
    PredictParams,
    prompt_tokens_of,
    target_of,
)

__all__ = ["PRIOR_EVERY", "QUEUE_PRIOR_N", "PredictParams", "PredictedLatencyScorer", "register_predicted"]


class PredictedLatencyScorer(Scorer):
    """Predicted TTFT per worker (queue wait + uncached tokens / learned prefill rate), SLO-aware."""

    name = "predicted-latency"
    needs_tokens = True
    bounded = True  # exp(≤ 0), ratios of a smaller over a larger, 0.5 + ≤ 0.5, 0.99 × ≤ 1 and 1.0

    def __init__(
        self,
        index: KvIndexView | None,
        params: PredictParams | None = None,
        in_flight: InFlightPrefixes | None = None,
        clock: Any = None,
        stats: LatencyStats | None = None,
    ) -> None:
        p = params or PredictParams()
        self.p = p
        self.index = index
        self.in_flight = in_flight
        self.clock = clock if clock is not None else time.monotonic
        self.stats = stats if stats is not None else LatencyStats()
        self.decay = math.log(2.0) / p.half_life
        self.salt = p.seed if p.seed is not None else random.getrandbits(32)
        self.prior = p.prior_tokens_per_s
        self._cols: dict[str, Floats] = {c: np.zeros(64, np.float64) for c in COLUMNS}
        self._cols["rate"][:] = self.prior
        self._observed = 0
        self._queued_term = False
        self._owner: list[str | None] = [None] * 64
        self.pending: dict[str, tuple[int, float, float, float, float, float]] = {}
        """request id → (row, routed at, predicted first token at, row's shift then, uncached tokens,
        the queued-behind term then: -1 when it was routed to an idle queue)."""
        self._last: tuple[str, Rows, Floats] | None = None
        """(request id, candidate rows, uncached tokens) of the last request scored."""
        self._wait: tuple[str, Rows, Floats | None] | None = None
        """(request id, rows, backlog or None: none) of the last :meth:`request_backlog`."""
        self._latest = LatestBusy()
        """The latest ``busy`` of any row: no backlog pass while every queue is empty."""
        self._at_memo: tuple[Rows, Rows | slice] | None = None

    # -- the per-row model ----------------------------------------------------------------
    def _grow(self, size: int) -> None:
        if size <= len(self._owner):
            return
        n = max(size, 2 * len(self._owner))
        for c, old in self._cols.items():
            new = np.full(n, self.prior if c == "rate" else 0.0, np.float64)
            new[: len(old)] = old
            self._cols[c] = new
        self._owner.extend([None] * (n - len(self._owner)))

    def _row(self, ep: Endpoint) -> int:
        """``ep``'s row, its model reset when the row last belonged to another worker."""
        row = ep.row
        self._grow(row + 1)
        if self._owner[row] != ep.worker_id:
            self._owner[row] = ep.worker_id
            for col in self._cols.values():
                col[row] = 0.0
            self._cols["rate"][row] = self.prior
        return row

    def rates(self, rows: Sequence[int] | np.ndarray) -> Floats:
        """Learned prefill rate (tokens/s) per row (kept current as observations come)."""
        return self._cols["rate"][rows]

    def backlog(self, rows: Rows) -> Floats:
        """Predicted seconds until each row's prefill queue is empty (0: idle)."""
        self._grow(state().size)
        return np.maximum(self._cols["busy"][self._at(rows)] - self.clock(), 0.0)  # type: ignore[no-any-return]

    def request_backlog(self, ctx: RequestContext, rows: Rows) -> Floats | None:
        """:meth:`backlog` for ``ctx``'s decision (None: every queue is empty, all 0), kept for
        :meth:`predict` of the same request over the same rows (``predicted-guard`` computes it
        first: one clock reading, one pass)."""
        wait = self._backlog_or_none(rows)
        self._wait = (ctx.request_id, rows, wait)
        return wait

    def _backlog_or_none(self, rows: Rows) -> Floats | None:
        """:meth:`backlog`, or None without a pass when no row's queue is busy past now."""
        self._grow(state().size)
        now = self.clock()
        busy = self._cols["busy"]
        if not self._latest.busy_after(now, busy):
            return None
        wait = busy[self._at(rows)] - now
        np.maximum(wait, 0.0, out=wait)
        return wait

    def _at(self, rows: Rows) -> Rows | slice:
        """``rows`` as an index into the columns: a slice (a view, no gather) when they are one
        ascending run, as a whole fleet's candidates usually are; remembered per rows array
        (candidate lists, and their rows, are never changed in place)."""
        memo = self._at_memo
        if memo is not None and memo[0] is rows:
            return memo[1]
        n = len(rows)
        at: Rows | slice = rows
        if n > 1 and int(rows[-1]) - int(rows[0]) == n - 1 and bool((np.diff(rows) == 1).all()):
            at = slice(int(rows[0]), int(rows[0]) + n)
        self._at_memo = (rows, at)
        return at

    def _blend(self, rows: Sequence[int] | np.ndarray) -> Floats:
        """Each row's own rate, blended with the prior until it has ``min_observations``."""
        c = self._cols
        sx, sy, n = c["sx"][rows], c["sy"][rows], c["n"][rows]
        own = np.where(sy > 1e-9, sx / np.maximum(sy, 1e-9), self.prior)
        k = self.p.min_observations
        w = n / (n + k) if k > 0 else np.ones_like(n)
        rate = w * own + (1.0 - w) * self.prior
        return np.maximum(rate, MIN_RATE, out=rate)  # type: ignore[no-any-return]

    def _blend_one(self, row: int) -> float:
        """:meth:`_blend` of one row, in Python floats (no array round trip per first token)."""
        c = self._cols
        sx, sy, n = float(c["sx"][row]), float(c["sy"][row]), float(c["n"][row])
        own = sx / sy if sy > 1e-9 else self.prior
        k = self.p.min_observations
        w = n / (n + k) if k > 0 else 1.0
        return max(w * own + (1.0 - w) * self.prior, MIN_RATE)

    def tpot(self, rows: Sequence[int] | np.ndarray, batch: Floats) -> Floats:
        """Predicted inter-token latency (seconds) per row at ``batch`` requests in flight: a line
        fitted to (batch, mean ITL) with ``min_observations`` pseudo-points of the flat prior at
        batch 1 and 2 (the prior alone gives ``prior_itl_ms``, slope 0)."""
        c = self._cols
        k = max(self.p.min_observations, 1.0)
        a0 = self.p.prior_itl_ms / 1000.0
        w, b, i = c["iw"][rows] + 2 * k, c["ib"][rows] + 3 * k, c["ii"][rows] + 2 * k * a0
        bb, bi = c["ibb"][rows] + 5 * k, c["ibi"][rows] + 3 * k * a0
        det = w * bb - b * b
        slope = np.maximum((w * bi - b * i) / np.maximum(det, 1e-12), 0.0)
        base = (i - slope * b) / w
        return np.maximum(base + slope * batch, 1e-4)  # type: ignore[no-any-return]

    def _decay(self, row: int, column: str, now: float, names: tuple[str, ...]) -> None:
        c = self._cols
        dt = now - c[column][row]
        if dt > 0:
            f = math.exp(-self.decay * dt)
            for name in names:
                c[name][row] *= f
        c[column][row] = now

    # -- scoring ---------------------------------------------------------------------------
    def predict(self, ctx: RequestContext, candidates: Sequence[Endpoint]) -> tuple[Rows, Floats, Floats]:
        """(rows, uncached tokens, predicted TTFT) of ``candidates`` for this request."""
        rows, uncached, ttft, _ = self._predict(ctx, candidates, None)
        return rows, uncached, ttft

    def _predict(
        self, ctx: RequestContext, candidates: Sequence[Endpoint], factor: float | None
    ) -> tuple[Rows, Floats, Floats, float]:
        """:meth:`predict` and the lowest TTFT; with ``factor``, ``(TTFT − lowest) · factor``
        instead of the TTFTs (one pass, :func:`~infera_core.scheduling.arrays.predicted_ttft`)."""
        rows = rows_of(candidates)
        kept, self._wait = self._wait, None  # used once: a retry of this request reads the clock again
        if kept is not None and kept[0] == ctx.request_id and kept[1] is rows:
            wait = kept[2]  # the guard's, this decision: the same rows, the same clock reading
        else:
            wait = self._backlog_or_none(rows)
        at = self._at(rows)
        c = self._cols
        # the queued-behind term where the queue is not empty, once some worker has learned one
        # (wait None: every backlog is 0, so is its share)
        qerr = c["qerr"][at] if wait is not None and self._queued_term else None
        overlap = self._overlap(ctx, candidates, rows)
        uncached, ttft, low = predicted_ttft(
            overlap, c["rate"][at], wait, qerr, prompt_tokens_of(ctx), factor
        )
        return rows, uncached, ttft, low

    @staticmethod
    def _batch(rows: Rows) -> Floats:
        """The batch a request sent now would decode in: the requests in flight there, plus it."""
        return state().in_flight[rows].astype(np.float64) + 1.0  # type: ignore[no-any-return]

    def _overlap(self, ctx: RequestContext, candidates: Sequence[Endpoint], rows: Any) -> Floats:
        """Each candidate's cached share of the prompt: ``kv-overlap``'s when it scored this
        request just before (as it is: :func:`predicted_ttft` clips it, into a new array)."""
        last = self.in_flight.last if self.in_flight is not None else None
        if last is not None and last[0] == ctx.request_id and len(last[2]) == len(candidates):
            return last[2]  # type: ignore[return-value]
        index = self.index
        if index is None or not ctx.token_ids:
            return np.zeros(len(candidates), np.float64)
        out = np.zeros(len(candidates), np.float64)
        get = index.views_by_key.get
        views = [get((ep.worker_id, ep.dp_rank)) for ep in candidates]
        sizes = {v.block_size for v in views if v is not None}
        if len(sizes) == 1:
            hashes = ctx.cached_block_hashes(sizes.pop(), index.hash_prompt)
            if hashes:
                out[:] = np.asarray(index.match(hashes, views, (1.0, 0.0, 0.0))) / len(hashes)
        return out

    def score_rows(self, ctx: RequestContext, candidates: Sequence[Endpoint]) -> Floats:
        if not candidates:
            return np.zeros(0, np.float64)
        p = self.p
        t_ttft = target_of(ctx, TTFT_TARGET_HEADER, "ttft_target_ms", p.ttft_target_ms)
        t_tpot = target_of(ctx, TPOT_TARGET_HEADER, "tpot_target_ms", p.tpot_target_ms)
        untargeted = t_ttft is None and t_tpot is None
        # in seconds: Δ TTFT of scale_s costs the score 63 % (the shift and scale in the same pass)
        factor = -1.0 / p.scale_s if untargeted and p.scale_s is not None else None
        rows, uncached, ttft, low = self._predict(ctx, candidates, factor)
        self._last = (ctx.request_id, rows, uncached)
        if untargeted:
            if factor is not None:
                scores = np.exp(ttft, out=ttft)  # ttft holds (TTFT − lowest) · factor: this call's own
            else:
                eps = p.slack_ms / 1000.0
                scores = (low + eps) / (ttft + eps)
            eligible = None
        else:
            ratio = np.zeros(len(rows), np.float64)
            if t_ttft is not None:
                ratio = np.maximum(ratio, ttft / t_ttft)
            if t_tpot is not None:
                ratio = np.maximum(ratio, self.tpot(rows, self._batch(rows)) / t_tpot)
            meets = ratio <= 1.0
            if meets.any():
                best, eps = ttft[meets].min(), self.p.slack_ms / 1000.0
                scores = np.where(meets, 0.5 + 0.5 * (best + eps) / (ttft + eps), 0.4 * ratio.min() / ratio)
                eligible = np.flatnonzero(meets)
            else:
                scores = ratio.min() / ratio
                eligible = None
        if self.p.exploration and len(rows) > 1:
            # drawn from the request id and the seed: the same request scores the same every time
            draw = zlib.crc32(ctx.request_id.encode(), self.salt)
            if (draw & 0xFFFF) < self.p.exploration * 0x10000:
                pool = eligible if eligible is not None else np.arange(len(rows))
                scores = scores * 0.99
                scores[int(pool[(draw >> 16) % len(pool)])] = 1.0
        return scores  # type: ignore[no-any-return]

    def score(self, ctx: RequestContext, candidates: Sequence[Endpoint]) -> list[float]:
        return self.score_rows(ctx, candidates).tolist()  # type: ignore[no-any-return]

    def explain(
        self, ctx: RequestContext, candidates: Sequence[Endpoint], scores: Sequence[float]
    ) -> list[dict[str, Any]]:
        """Per candidate: the predicted TTFT and TPOT (ms) and the learned prefill rate."""
        rows, _, ttft = self.predict(ctx, candidates)
        rates, tpot = self.rates(rows), self.tpot(rows, self._batch(rows))
        return [
            {
                "predicted_ttft_ms": round(float(a) * 1000, 2),
                "predicted_tpot_ms": round(float(b) * 1000, 2),
                "prefill_tokens_per_s": round(float(r)),
            }
            for a, b, r in zip(ttft, tpot, rates, strict=True)
        ]

    # -- learning --------------------------------------------------------------------------
    def on_routed(self, ctx: RequestContext, endpoint: Endpoint) -> None:
        row = self._row(endpoint)
        now = self.clock()
        last = self._last
        c = self._cols
        rate = float(c["rate"][row])
        uncached = -1.0
        if last is not None and last[0] == ctx.request_id:
            at = self._at(last[1])
            if type(at) is slice:  # one run of rows: the position is the offset
                if at.start <= row < at.stop:
                    uncached = float(last[2][row - at.start])
            elif (hit := np.flatnonzero(last[1] == row)).size:
                uncached = float(last[2][int(hit[0])])
        if uncached < 0:
            n_tokens = prompt_tokens_of(ctx)
            share = float(np.minimum(np.maximum(self._overlap(ctx, [endpoint], None)[0], 0.0), 1.0))
            uncached = n_tokens * (1.0 - share)
        busy = float(c["busy"][row])
        queued = busy > now
        extra = float(c["qerr"][row]) if queued else 0.0
        done = max(now, busy) + uncached / rate
        c["busy"][row] = done
        self._latest.wrote(row, done)
        self.pending[ctx.request_id] = (
            row,
            now,
            done,
            float(c["shift"][row]),
            uncached,
            extra if queued else -1.0,
        )
        self.stats.predicted[endpoint.worker_id] = done - now + extra
        self.stats.busy[endpoint.worker_id] = done
        self.stats.rates[endpoint.worker_id] = rate

    def on_first_token(self, ctx: RequestContext, endpoint: Endpoint) -> None:
        entry = self.pending.pop(ctx.request_id, None)
        if entry is None:
            return
        row, routed, predicted, shift_then, uncached, extra = entry
        if self._owner[row] != endpoint.worker_id:
            return
        now = self.clock()
        c = self._cols
        self.stats.observed[endpoint.worker_id] = now - routed
        self.stats.error(abs(now - predicted - max(extra, 0.0)))
        # the queue: move it by this request's error (errors already applied since it was routed aside)
        delta = now - (predicted + c["shift"][row] - shift_then)
        if extra >= 0:  # it queued behind others: learn how much later than the queue model such come
            self._decay(row, "t_q", now, ("qe", "qn"))
            c["qe"][row] += delta
            c["qn"][row] += 1.0
            c["qerr"][row] = max(0.0, float(c["qe"][row]) / (float(c["qn"][row]) + QUEUE_PRIOR_N))
            self._queued_term = True
        c["shift"][row] += delta
        c["busy"][row] = busy = max(c["busy"][row] + delta, now)
        self._latest.wrote(row, float(busy))
        self._latest.compact(c["busy"])
        self.stats.busy[endpoint.worker_id] = float(busy)
        # the rate: its uncached tokens over the worker's busy time for it
        start = max(routed, float(c["last_first"][row]))
        c["last_first"][row] = max(now, float(c["last_first"][row]))
        self._decay(row, "t_fit", now, ("sx", "sy", "n"))
        c["sx"][row] += uncached
        c["sy"][row] += max(0.0, now - start)
        c["n"][row] += 1.0
        self._observed += 1
        if self._observed <= 4 * PRIOR_EVERY or self._observed % PRIOR_EVERY == 0:  # the fleet's median
            self._refresh_prior()
        else:
            c["rate"][row] = self._blend_one(row)

    def _refresh_prior(self) -> None:
        c = self._cols
        known = np.flatnonzero((c["n"] >= self.p.min_observations) & (c["sy"] > 1e-9))
        if len(known):
            median = float(np.median(c["sx"][known] / c["sy"][known]))
            if median > 0:  # 0: every prompt they saw was cached, which says nothing of a rate
                self.prior = median
        c["rate"][:] = self._blend(slice(None))  # type: ignore[arg-type]

    def on_timing(
        self, ctx: RequestContext, endpoint: Endpoint, since_first_token: float, mean_itl: float | None
    ) -> None:
        if mean_itl is None or self._owner[endpoint.row] != endpoint.worker_id:
            return
        row = endpoint.row
        now = self.clock()
        self._decay(row, "t_itl", now, ("iw", "ib", "ii", "ibb", "ibi"))
        c = self._cols
        b = float(max(endpoint.in_flight, 1))
        c["iw"][row] += 1.0
        c["ib"][row] += b
        c["ii"][row] += mean_itl
        c["ibb"][row] += b * b
        c["ibi"][row] += b * mean_itl

    def on_finished(self, ctx: RequestContext, endpoint: Endpoint, ok: bool) -> None:
        self.pending.pop(ctx.request_id, None)


def predicted_profile(
    weight: float = 0.6, fill: float = 0.8, scale_s: float = 0.3, gap_s: float = 2.0
) -> ProfileConfig:
    """The ``predicted-latency`` preset: ``kv-aware``'s scorers (cache overlap, load, cache fill,
    session) with ``predicted-guard`` (backlog within ``gap_s`` seconds of the shortest) instead
    of its imbalance guard (the prediction balances by speed, not by counts), plus the predicted
    TTFT at ``weight``, scored in seconds (``scale_s``); cache fill weighs more (``fill``) so new
    prompts still spread over every worker's cache while the fast workers take the larger share."""
    cfg = kv_profile(1.0, 0.1, 0.02, 1.2, 16.0, fill=fill, session=0.3)
    cfg.filters = [*BASE_FILTERS, PluginRef(name="predicted-guard", params={"gap_s": gap_s})]
    cfg.scorers.append(ScorerRef(name="predicted-latency", weight=weight, params={"scale_s": scale_s}))
    return cfg


def register_predicted(registry: PolicyRegistry) -> None:
    """Add the ``predicted-latency`` scorer and preset (after :func:`infera_policies.kv.register_kv`)."""

    def build(p: Any, d: SchedulerDeps) -> Scorer:
        shared = d.extra.get(IN_FLIGHT_KEY)
        if not isinstance(shared, InFlightPrefixes):
            shared = d.extra[IN_FLIGHT_KEY] = InFlightPrefixes(d.clock)
        scorer = PredictedLatencyScorer(d.kv_index, p, shared, d.clock, d.latency)
        d.extra[PREDICTOR_KEY] = scorer
        return scorer

    def build_guard(p: Any, d: SchedulerDeps) -> Filter:
        return PredictedGuard(d.extra, p)

    registry.add(
        PolicyFactory(
            "predicted-latency", "scorer", build, PredictParams, PredictedLatencyScorer.__doc__ or ""
        )
    )
    registry.add(
        PolicyFactory(
            "predicted-guard", "filter", build_guard, PredictedGuardParams, PredictedGuard.__doc__ or ""
        )
    )
    registry.add_preset(
        "predicted-latency",
        predicted_profile(),
        "Latency-predicting: each worker's TTFT learned online (queue + uncached tokens / prefill rate); "
        "honours per-request TTFT/TPOT targets.",
    )
