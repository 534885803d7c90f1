"""``infera-run bench`` settings: each flag also reads ``INFERA_<NAME>`` and ``--config FILE``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import NoDecode

from infera_core.config.settings import InferaSettings

Workload = Literal["random", "shared-prefix", "multi-turn", "trace"]


class BenchSettings(InferaSettings):
    """What to send, how fast, and where the results go."""

    url: Annotated[list[str], NoDecode] = Field(
        default=[],
        description="OpenAI-compatible base URL (repeat to compare targets), e.g. http://127.0.0.1:8000/v1",
    )
    model: str | None = Field(
        None,
        description="Model name to send (default: the first of GET /v1/models)",
        json_schema_extra={"env": "INFERA_BENCH_MODEL", "old_env": ["INFERA_MODEL"]},
    )
    workload: Workload = Field("random", description="Workload to generate")
    num_requests: int = Field(200, gt=0, description="random: number of requests")
    input_len: int = Field(
        256, gt=0, description="random: prompt words (≈ tokens); multi-turn: first message words"
    )
    output_len: int = Field(64, gt=0, description="Tokens to generate per request (trace: from the trace)")
    range_ratio: float = Field(
        0.0, ge=0, lt=1, description="random: lengths vary uniformly by ± this fraction"
    )
    groups: int = Field(16, gt=0, description="shared-prefix: number of prefix groups")
    prefix_len: int = Field(512, ge=0, description="shared-prefix: words in each group's shared prefix")
    questions_per_group: int = Field(8, gt=0, description="shared-prefix: requests per group")
    question_len: int = Field(32, gt=0, description="shared-prefix: words in each question")
    sessions: int = Field(16, gt=0, description="multi-turn: conversations")
    turns: int = Field(4, gt=0, description="multi-turn: user turns per conversation")
    turn_len: int = Field(64, gt=0, description="multi-turn: words in each later user message")
    system_len: int = Field(
        0, ge=0, description="multi-turn: words of a system prompt shared by all sessions"
    )
    think_time: float = Field(0.0, ge=0, description="multi-turn: seconds between a reply and the next turn")
    trace: Path | None = Field(None, description="trace: Mooncake JSONL file (timestamp, input_length, …)")
    time_scale: float = Field(
        1.0, ge=0, description="trace: multiply arrival times by this (0.1 = 10× faster)"
    )
    max_requests: int | None = Field(None, gt=0, description="trace: replay at most this many rows")
    max_output_len: int | None = Field(None, gt=0, description="trace: cap each row's output length")
    tokens_per_block: int = Field(
        512, gt=0, description="trace: tokens per trace block (hash id); input lengths scale with it"
    )
    vocab_size: int = Field(32000, gt=16, description="trace: token ids are drawn below this")
    ignore_timestamps: bool = Field(
        False, description="trace: closed loop at --concurrency instead of timestamps"
    )
    concurrency: int | None = Field(
        None, gt=0, description="Closed loop: requests in flight (default 8); open loop: cap on in flight"
    )
    rate: float | None = Field(None, gt=0, description="Open loop: Poisson arrivals at this many requests/s")
    api: Literal["auto", "completions", "chat"] = Field(
        "auto", description="Endpoint for text prompts (auto: chat for multi-turn, else completions)"
    )
    ignore_eos: bool = Field(
        True, description="Send ignore_eos so every request generates --output-len tokens"
    )
    slo: str | None = Field(None, description="Goodput targets, e.g. ttft=500ms,itl=50ms[,e2e=5s]")
    metrics_url: Annotated[list[str], NoDecode] = Field(
        default=[],
        description="Worker /metrics URLs for the cache hit rate (default: from the router's GET /v1/workers)",
    )
    json_out: Path | None = Field(
        None,
        description="Write results (summary and every request) as JSON",
        json_schema_extra={"flag": "--json"},
    )
    report: Path | None = Field(
        None, description="Write a Markdown report with PNG plots into this directory"
    )
    compare: bool = Field(False, description="Run the workload against every --url / --policies back to back")
    policies: str | None = Field(
        None,
        description="Comma list of router policies, a local stack each (with --compare): a preset, "
        "a preset with parameters changed (kv-aware:kv-overlap.cpu=0:kv-overlap.disk=0), or a "
        "router-config .yaml",
    )
    workers: int = Field(
        4,
        gt=0,
        description="--policies: workers in each local stack",
        json_schema_extra={"env": "INFERA_BENCH_WORKERS", "old_env": ["INFERA_WORKERS"]},
    )
    engine: str = Field(
        "sim",
        description="--policies: engine of the local stack's workers",
        json_schema_extra={"env": "INFERA_BENCH_ENGINE", "old_env": ["INFERA_ENGINE"]},
    )
    engine_args: str | None = Field(
        None, description="--policies: extra engine flags (one string, shell-split)"
    )
    api_key: SecretStr | None = Field(
        None,
        description="API key sent as 'Authorization: Bearer' with every request (a router with "
        "--api-key-file). Prefer the env var to the flag.",
    )
    admin_token: SecretStr | None = Field(
        None,
        description="The router's admin token, to read its /metrics and /v1/workers (picks, "
        "routing latency, cache hit rate). Prefer the env var to the flag.",
    )
    seed: int = Field(0, description="Random seed for workload generation")
    timeout: float = Field(300.0, gt=0, description="Seconds before one request counts as timed out")
    quiet: bool = Field(
        False,
        description="No progress bar",
        json_schema_extra={"env": "INFERA_BENCH_QUIET", "old_env": ["INFERA_QUIET"]},
    )

    @field_validator("url", "metrics_url", mode="before")
    @classmethod
    def _comma_list(cls, value: object) -> object:
        """``INFERA_URL=http://a/v1,http://b/v1`` (env vars hold one string)."""
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        return value
