"""Per request, a PD pair or local prefill (``pd.mode: auto`` on a fleet with both kinds).

A model served by mixed workers *and* prefill/decode pairs decides per request from the
predicted time to first token of each way:

* **local** (the best mixed worker): ``wait + uncached / rate``;
* **PD** (the best prefill worker): ``wait + uncached / rate + uncached × transfer + overhead``.

``uncached`` is the prompt minus the prefix the KV index says that worker holds, so a short
prompt or a cache hit on a mixed worker stays local; a long uncached prompt goes to a pair when
the prefill worker is predicted faster (idle, or a higher rate). A mixed worker's ``rate`` and
``wait`` are the ``predicted-latency`` scorer's (:class:`LatencyStats` ``rates`` / ``busy``,
written when that scorer routes the mixed traffic), else the prior rate and the prompt tokens in
flight there over it. A prefill worker's are learned here from the PD prefill legs (the
scorer leaves them out: a leg's first token is the pair's): uncached tokens over the worker's
busy time for them, with exponential forgetting. The transfer cost per token is the
configured ``transfer_ms_per_1k_tokens``, else learned from the PD transfer phase.
:func:`choose` is the decision itself, a pure function of the two sides' estimates.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from infera_core.request import RequestContext
from infera_core.scheduling.types import Endpoint, KvIndexView, LatencyStats

WARM_LEGS = 4.0
"""Prefill legs seen before a prefill worker's own rate replaces the prior (blended until then)."""


class PdAutoParams(BaseModel):
    """The router config's ``pd.auto:`` section (per-request PD under ``mode: auto``)."""

    model_config = ConfigDict(extra="forbid")

    min_pd_tokens: int = Field(
        256, ge=0, description="Uncached prompt tokens below which a request stays on a mixed worker."
    )
    overhead_ms: float = Field(5.0, ge=0, description="A pair's fixed cost: the second leg, the handshake.")
    transfer_ms_per_1k_tokens: float | None = Field(
        None,
        ge=0,
        description="KV transfer cost per 1000 prompt tokens (None: learned from the transfer phase).",
    )
    prior_transfer_ms_per_1k_tokens: float = Field(
        2.0, ge=0, description="Transfer cost assumed until one is learned."
    )
    prior_tokens_per_s: float = Field(
        10000.0, gt=0, description="Prefill rate assumed before one is learned."
    )
    half_life: float = Field(5.0, gt=0, description="Seconds after which an observation weighs half.")


@dataclass(frozen=True, slots=True)
class Side:
    """One worker's estimate for this request: uncached tokens, queue wait (s), rate (tokens/s)."""

    worker: str
    uncached: float
    wait: float
    rate: float

    @property
    def ttft(self) -> float:
        return self.wait + self.uncached / self.rate


@dataclass(frozen=True, slots=True)
class PdChoice:
    """The decision and the two predictions behind it (seconds; None: that side has no worker)."""

    pd: bool
    local: Side | None
    prefill: Side | None
    local_s: float | None
    pd_s: float | None
    reason: str

    def as_dict(self) -> dict[str, Any]:
        """What an explanation shows (``X-Infera-Explain``)."""

        def ms(x: float | None) -> float | None:
            return None if x is None else round(x * 1000, 2)

        return {
            "choice": "pd" if self.pd else "local",
            "reason": self.reason,
            "predicted_local_ttft_ms": ms(self.local_s),
            "predicted_pd_ttft_ms": ms(self.pd_s),
            "local_worker": self.local.worker if self.local else None,
            "prefill_worker": self.prefill.worker if self.prefill else None,
            "uncached_local": round(self.local.uncached) if self.local else None,
            "uncached_prefill": round(self.prefill.uncached) if self.prefill else None,
        }


def choose(
    local: Sequence[Side],
    prefill: Sequence[Side],
    *,
    transfer_s_per_token: float,
    overhead_s: float,
    min_pd_tokens: int,
) -> PdChoice:
    """Local prefill on the best mixed worker, or a pair with the best prefill worker."""
    best_local = min(local, key=lambda s: s.ttft, default=None)
    best_pd = min(prefill, key=lambda s: s.ttft + s.uncached * transfer_s_per_token, default=None)
    local_s = best_local.ttft if best_local else None
    pd_s = best_pd.ttft + best_pd.uncached * transfer_s_per_token + overhead_s if best_pd else None
    if best_pd is None or pd_s is None:
        return PdChoice(False, best_local, None, local_s, None, "no prefill worker")
    if best_local is None or local_s is None:
        return PdChoice(True, None, best_pd, None, pd_s, "no mixed worker")
    if best_local.uncached < min_pd_tokens:
        return PdChoice(False, best_local, best_pd, local_s, pd_s, f"under {min_pd_tokens} uncached tokens")
    if pd_s < local_s:
        return PdChoice(True, best_local, best_pd, local_s, pd_s, "pair predicted faster")
    return PdChoice(False, best_local, best_pd, local_s, pd_s, "local predicted faster")


def uncached_tokens(ctx: RequestContext, eps: Sequence[Endpoint], index: KvIndexView | None) -> list[float]:
    """Per endpoint: the prompt's tokens minus the prefix its KV view holds."""
    n = float(ctx.prompt_tokens())
    if index is None or not ctx.token_ids or not eps:
        return [n] * len(eps)
    views = [index.views_by_key.get((ep.worker_id, ep.dp_rank)) for ep in eps]
    sizes = {v.block_size for v in views if v is not None}
    if len(sizes) != 1:
        return [n] * len(eps)
    size = sizes.pop()
    hashes = ctx.cached_block_hashes(size, index.hash_prompt)
    if not hashes:
        return [n] * len(eps)
    hits = index.match(hashes, views, (1.0, 0.0, 0.0))
    return [max(0.0, n - h * size) for h in hits]


class PdPredictor:
    """Learns prefill workers' rates and the transfer cost; estimates both sides of a request."""

    def __init__(
        self, params: PdAutoParams, stats: LatencyStats, index: KvIndexView | None, clock: Callable[[], float]
    ) -> None:
        self.p = params
        self.stats = stats
        self.index = index
        self.clock = clock
        self.decay = math.log(2.0) / params.half_life
        self._fit: dict[str, list[float]] = {}
        """prefill worker → [decayed tokens, decayed seconds, decayed count, last update, last leg end,
        busy until, shift, legs seen]: ``busy`` is when its legs are predicted done; ``shift`` sums the errors
        already applied to it (as the scorer's queue)."""
        self._transfer = [0.0, 0.0, 0.0]
        """decayed tokens, seconds, last update."""
        self.pending: dict[str, tuple[str, float, float, float, float]] = {}
        """request id → (prefill worker, routed at, uncached tokens, predicted done, shift then)."""

    # -- estimates -------------------------------------------------------------------------
    def rate(self, worker: str) -> float:
        fit = self._fit.get(worker)
        prior = self.p.prior_tokens_per_s
        if fit is None or fit[1] <= 1e-9:
            return prior
        w = min(fit[7] / WARM_LEGS, 1.0)
        return w * fit[0] / fit[1] + (1.0 - w) * prior

    def transfer_s_per_token(self) -> float:
        if self.p.transfer_ms_per_1k_tokens is not None:
            return self.p.transfer_ms_per_1k_tokens / 1e6
        tokens, seconds, _ = self._transfer
        prior = self.p.prior_transfer_ms_per_1k_tokens / 1e6
        if tokens <= 0:
            return prior
        w = min(tokens / 4096.0, 1.0)  # a few thousand tokens observed before it outweighs the prior
        return w * seconds / tokens + (1.0 - w) * prior

    def decide(self, ctx: RequestContext, mixed: Sequence[Endpoint], prefill: Sequence[Endpoint]) -> PdChoice:
        now = self.clock()
        stats = self.stats
        local: list[Side] = []
        for ep, u in zip(mixed, uncached_tokens(ctx, mixed, self.index), strict=True):
            rate = stats.rates.get(ep.worker_id) or self.p.prior_tokens_per_s
            busy = stats.busy.get(ep.worker_id)
            wait = max(0.0, busy - now) if busy is not None else ep.in_flight_prompt_tokens / rate
            local.append(Side(ep.worker_id, u, wait, rate))
        sides: list[Side] = []
        for ep, u in zip(prefill, uncached_tokens(ctx, prefill, self.index), strict=True):
            fit = self._fit.get(ep.worker_id)
            wait = max(0.0, fit[5] - now) if fit is not None else 0.0
            sides.append(Side(ep.worker_id, u, wait, self.rate(ep.worker_id)))
        return choose(
            local,
            sides,
            transfer_s_per_token=self.transfer_s_per_token(),
            overhead_s=self.p.overhead_ms / 1000.0,
            min_pd_tokens=self.p.min_pd_tokens,
        )

    # -- learning --------------------------------------------------------------------------
    def routed(self, ctx: RequestContext, prefill: Endpoint) -> None:
        """A pair with ``prefill`` was picked for ``ctx``: its uncached tokens join that queue."""
        now = self.clock()
        u = uncached_tokens(ctx, [prefill], self.index)[0]
        fit = self._fit.setdefault(prefill.worker_id, [0.0, 0.0, 0.0, now, 0.0, 0.0, 0.0, 0.0])
        fit[5] = max(fit[5], now) + u / self.rate(prefill.worker_id)
        self.pending[ctx.request_id] = (prefill.worker_id, now, u, fit[5], fit[6])

    def prefill_done(self, ctx: RequestContext, prefill: Endpoint, ok: bool) -> None:
        """The prefill leg of ``ctx`` ended (``ok``: answered): learn the worker's rate."""
        entry = self.pending.get(ctx.request_id)
        if entry is None or entry[0] != prefill.worker_id:
            return
        fit = self._fit.get(prefill.worker_id)
        if fit is None:
            return
        now = self.clock()
        _, routed, u, predicted, shift_then = entry
        if not ok:
            self.pending.pop(ctx.request_id, None)
            fit[5] = max(now, fit[5] - u / self.rate(prefill.worker_id))
            return
        # the queue: moved by this leg's error (the errors applied since it was sent aside)
        delta = now - (predicted + fit[6] - shift_then)
        fit[6] += delta
        fit[5] = max(fit[5] + delta, now)
        f = math.exp(-self.decay * max(0.0, now - fit[3]))
        start = max(routed, fit[4])
        fit[0] = fit[0] * f + u
        fit[1] = fit[1] * f + max(1e-6, now - start)
        fit[2] = fit[2] * f + 1.0
        fit[7] += 1.0
        fit[3] = now
        fit[4] = max(fit[4], now)
        self.stats.rates[prefill.worker_id] = self.rate(prefill.worker_id)

    def transferred(self, ctx: RequestContext, seconds: float) -> None:
        """The PD transfer phase of ``ctx`` took ``seconds`` (prefill answered → decode's headers)."""
        entry = self.pending.pop(ctx.request_id, None)
        if entry is None:
            return
        now = self.clock()
        t = self._transfer
        f = math.exp(-self.decay * max(0.0, now - t[2]))
        t[0] = t[0] * f + entry[2]
        t[1] = t[1] * f + max(0.0, seconds)
        t[2] = now

    def forget(self, ctx: RequestContext) -> None:
        self.pending.pop(ctx.request_id, None)
