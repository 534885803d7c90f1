"""``infera-run plan`` and ``infera-run calibrate`` settings (flags, ``INFERA_*`` env, ``--config``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from infera_core.config.settings import InferaSettings


class TraceFlags(InferaSettings):
    """The trace workload's own flags, spelled as ``infera-run bench --workload trace`` spells them."""

    trace: Path | None = Field(None, description="Mooncake JSONL trace (timestamp, input_length, …)")
    max_requests: int | None = Field(None, gt=0, description="replay at most this many rows")
    time_scale: float = Field(1.0, ge=0, description="multiply arrival times by this (0.1 = 10× faster)")
    max_output_len: int | None = Field(None, gt=0, description="cap each row's output length")
    tokens_per_block: int = Field(
        512, gt=0, description="tokens per trace block (hash id); input lengths scale with it"
    )
    vocab_size: int = Field(32000, gt=16, description="token ids are drawn below this")
    seed: int = Field(0, description="seed of the trace blocks' token ids")


class PlanSettings(TraceFlags):
    """What to replay, on which fleets, against which SLO."""

    profile: Path | None = Field(
        None,
        description="timing profile of one worker (infera-run calibrate)",
        json_schema_extra={"env": "INFERA_PLAN_PROFILE"},
    )
    slo: str | None = Field(
        None, description="targets, e.g. ttft_p90=2s,tpot_p90=50ms (metrics: ttft, tpot, e2e)"
    )
    workers: str = Field(
        "1..16",
        description="fleet sizes to try: N, A..B or a comma list",
        json_schema_extra={"env": "INFERA_PLAN_WORKERS"},
    )
    policy: str = Field(
        "kv-aware",
        description="routing presets to try (comma list), as serve --router-policy names them",
        json_schema_extra={"flag": "--router-policy", "aliases": ["--policy"], "env": "INFERA_PLAN_POLICY"},
    )
    pd_ratio: str | None = Field(
        None, description="PD splits to try besides mixed workers: mixed,1:1,1:3 (prefill:decode)"
    )
    engine: str = Field(
        "sim",
        description="engine whose virtual model replays the trace",
        json_schema_extra={"env": "INFERA_PLAN_ENGINE"},
    )
    cache_blocks: int | None = Field(
        None, gt=0, description="KV cache blocks per worker (default: the profile's, else 4096)"
    )
    plot: Path | None = Field(None, description="write a PNG of SLO attainment vs fleet size here")
    json_output: bool = Field(
        False,
        description='print the answer as JSON ({"workers": N, …})',
        json_schema_extra={"flag": "--json"},
    )


class CalibrateSettings(InferaSettings):
    """Which engine to measure, and how hard."""

    url: str | None = Field(
        None,
        description="OpenAI-compatible base URL of ONE engine, e.g. http://127.0.0.1:8000/v1",
        json_schema_extra={"env": "INFERA_CALIBRATE_URL"},
    )
    model: str | None = Field(
        None,
        description="model to send (default: the first of GET /v1/models)",
        json_schema_extra={"env": "INFERA_CALIBRATE_MODEL"},
    )
    out: Path | None = Field(
        None,
        description="write the profile here (default: print it)",
        json_schema_extra={"env": "INFERA_CALIBRATE_OUT"},
    )
    prompt_lens: str = Field("64,256,512,1024", description="prompt lengths (tokens) of the prefill probe")
    batch_sizes: str = Field("1,2,4,8", description="concurrent streams of the decode probe")
    decode_tokens: int = Field(32, gt=1, description="tokens each decode-probe stream generates")
    repeats: int = Field(3, gt=0, description="measurements per point (the median is kept)")
    vocab_size: int = Field(
        1000,
        gt=16,
        description="probe token ids are drawn below this (keep it under the model's vocabulary)",
        json_schema_extra={"env": "INFERA_CALIBRATE_VOCAB_SIZE"},
    )
    timeout: float = Field(120.0, gt=0, description="seconds before one probe request fails")
