"""KV-routing settings (embedded in the server's settings; every field has a flag and env var)."""

from __future__ import annotations

from pydantic import Field

from infera_core.tokenize.settings import TokenizeSettings


class KvSettings(TokenizeSettings):
    """Event hub, index and routing-tokenizer knobs (the tokenizer's bounds from
    :class:`~infera_core.tokenize.settings.TokenizeSettings`)."""

    kv_index_max_blocks: int = Field(
        4_000_000, ge=0, description="Most blocks mirrored for all workers together (0: unbounded)."
    )
    kv_silence_s: float = Field(
        60.0,
        gt=0,
        description="Warn (log + metric) when a worker with KV events was sent requests but published"
        " no events for this long.",
    )
    kv_reconnect_max_s: float = Field(5.0, gt=0, description="Longest backoff between KV event reconnects.")
    kv_replay_timeout_s: float = Field(2.0, gt=0, description="How long to wait for a KV replay answer.")
    kv_refill_s: float = Field(
        30.0, ge=0, description="A view cleared after lost events stays 'stale' this long while it refills."
    )
    kv_max_message_bytes: int = Field(
        16 * 1024 * 1024,
        ge=0,
        description="Largest KV event message accepted from a worker's publisher (ZMQ MAXMSGSIZE; a bigger"
        " one drops the connection and its events count as lost; 0: unlimited).",
    )
    kv_restart_window: int = Field(
        100_000, ge=1, description="A seq this far below the last one means the publisher restarted."
    )
    tokenizer: list[str] = Field(
        default=[],
        description="Routing tokenizer per model: MODEL=NAME[:PATH] (repeatable), e.g. llama=hf:/models/llama.",
    )
    card_max_bytes: int = Field(
        64 << 20,
        ge=0,
        description="Largest model card (bytes) the router fetches from a worker's discovery backend.",
    )
    card_fetch_timeout_s: float = Field(
        30.0, gt=0, description="How long the router tries to fetch and verify a model card (seconds)."
    )
    card_cache_dir: str | None = Field(
        None,
        description="Where fetched model cards are kept, one folder per digest (default:"
        " $XDG_CACHE_HOME/infera/cards or ~/.cache/infera/cards).",
    )
    kv_block_size: list[str] = Field(
        default=[],
        description="Expected KV block size per model: MODEL=N (repeatable); disagreeing workers are flagged.",
    )
