"""``predicted-latency``'s parameters and per-request inputs (its targets, the prompt's length),
and the names of its per-worker model's columns (:mod:`infera_policies.predicted`)."""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from infera_core.request import RequestContext

COLUMNS = (
    "busy",
    "shift",
    "sx",
    "sy",
    "n",
    "t_fit",
    "last_first",
    "iw",
    "ib",
    "ii",
    "ibb",
    "ibi",
    "t_itl",
    "rate",
    "qe",
    "qn",
    "qerr",
    "t_q",
)
PRIOR_EVERY = 32
"""Observations between two refreshes of the fleet's median rate (the cold-start prior)."""
MIN_RATE = 1.0
"""Tokens/s below which no learned prefill rate goes (a worker that only saw cached prompts)."""
QUEUE_PRIOR_N = 4.0
"""Pseudo-observations of a zero queued-behind term (a worker's own term takes over after a few)."""


class PredictParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    half_life: float = Field(5.0, gt=0, description="Seconds after which an observation weighs half.")
    min_observations: float = Field(
        4.0, ge=0, description="Observations (decayed) before a worker's own rate outweighs the prior."
    )
    prior_tokens_per_s: float = Field(
        10000.0, gt=0, description="Prefill rate assumed before any worker's is learned."
    )
    prior_itl_ms: float = Field(20.0, gt=0, description="Inter-token latency assumed before it is learned.")
    exploration: float = Field(
        0.02, ge=0, le=1, description="Share of requests sent to a random eligible worker."
    )
    ttft_target_ms: float | None = Field(None, gt=0, description="TTFT target of requests that name none.")
    tpot_target_ms: float | None = Field(None, gt=0, description="TPOT target of requests that name none.")
    slack_ms: float = Field(
        30.0, gt=0, description="Added to both sides of a TTFT ratio: differences well below it hardly count."
    )
    scale_s: float | None = Field(
        None,
        gt=0,
        description="Score exp(−(TTFT − best TTFT) / scale_s): differences weigh in seconds, whatever "
        "the queue's length (None: the ratio (best + slack) / (TTFT + slack)).",
    )
    seed: int | None = Field(
        0, ge=0, lt=2**32, description="Seed of the exploration draws (made from request ids; None: random)."
    )


def target_of(ctx: RequestContext, header: str, key_attr: str, default: float | None) -> float | None:
    """A request's target in seconds: its header, else its API key's, else the scorer's default."""
    raw = ctx.headers.get(header)
    if raw:
        try:
            ms = float(raw)
        except ValueError:
            ms = math.nan
        if ms > 0 and math.isfinite(ms):
            return ms / 1000.0
    key = getattr(ctx.principal, "key", None) if ctx.principal is not None else None  # its API key
    key_ms = getattr(key, key_attr, None) if key is not None else None
    if isinstance(key_ms, int | float) and key_ms > 0:
        return float(key_ms) / 1000.0
    return default / 1000.0 if default is not None else None


def prompt_tokens_of(ctx: RequestContext) -> float:
    """The prompt's length in tokens: its token ids, else estimated from its text (no tokenizer)."""
    return float(ctx.prompt_tokens())
