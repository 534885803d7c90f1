"""Router-queue settings of ``infera-run serve`` (``--queue-*``); what they do is in
``docs/how-to/operate.md`` (section "Queue, priorities and deadlines")."""

from __future__ import annotations

from pydantic import BaseModel, Field


class QueueSettings(BaseModel):
    """One pydantic field per flag / ``INFERA_*`` variable / config key."""

    queue_max: int = Field(
        1024,
        ge=0,
        description="Requests that may wait per model when every worker is saturated, instead of an"
        " immediate 429 (0: no queue, refuse at once).",
    )
    queue_timeout: float = Field(
        30.0, gt=0, description="Seconds a request may wait in the router queue before it gets 503."
    )
    queue_headroom: int = Field(
        0,
        ge=0,
        description="In-flight slots per worker (of --max-inflight-per-worker) that requests of a"
        " sheddable tier, and of a key holding its fair share of the slots or more, leave free: a"
        " critical request or a light key's finds a slot at once.",
    )
    queue_tier_window: float = Field(
        0.0,
        ge=0,
        description="While a request of a higher priority tier was dispatched in the last this many"
        " seconds, lower tiers keep to --queue-tier-share of the model's workers and off those running"
        " a higher tier, and the higher tier prefers workers with no lower-tier request (0: off).",
    )
    queue_tier_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="The part of a model's workers (at least one) a lower tier keeps to while a"
        " higher tier is active (--queue-tier-window).",
    )
    queue_engine_waiting: float = Field(
        0.0,
        ge=0,
        description="A worker whose engine reports this many waiting requests is saturated: requests"
        " queue in the router instead (0: not checked; read from the workers' /metrics).",
    )
    queue_engine_kv_usage: float = Field(
        0.0,
        ge=0,
        le=1,
        description="A worker whose engine reports this KV-cache usage (0-1) is saturated (0: not checked).",
    )
    queue_output_cap: int = Field(
        1024,
        ge=1,
        description="Output tokens a request counts at most in the fair share's cost"
        " (uncached prompt + min(max_tokens, this)).",
    )
