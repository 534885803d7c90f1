"""Routing-tokenizer settings: what routing tokenizes, how much of it, and what it keeps.

Shared by ``infera-run serve`` (through :class:`~infera_core.kv.settings.KvSettings`) and
``infera-run up``, which hands them to its embedded server with :meth:`tokenize_of`.
Every field is a flag and an ``INFERA_*`` variable. The bounds are explained in
``docs/how-to/operate.md`` (section "Limits").
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class TokenizeSettings(BaseModel):
    """Bounds on the work and memory routing tokenization may take per prompt and in all."""

    routing_max_tokens: int = Field(
        65_536,
        ge=0,
        description="Prompt tokens used for routing: a longer prompt routes on its first N tokens"
        " (its text is cut to 8 characters a token before tokenizing; 0: no bound but"
        " --tokenize-max-chars).",
    )
    tokenize_max_chars: int = Field(
        262_144,
        ge=1,
        description="Characters of a prompt (a chat: of its rendered template) tokenized for routing;"
        " the rest is never tokenized by the router, whatever the body size.",
    )
    tokenize_cache_size: int = Field(4096, ge=0, description="Prompts whose token ids are cached (LRU).")
    tokenize_cache_mb: float = Field(
        64.0,
        ge=0,
        description="Memory (MiB) for cached prompt token ids (LRU); a prompt longer than"
        " --tokenize-max-chars, or whose ids would take over an eighth of this, is not cached (0: no cache).",
    )
    tokenize_offload_chars: int = Field(
        4096, ge=0, description="Prompts longer than this (characters) are tokenized off the event loop."
    )
    tokenize_prefix_cache_mb: float = Field(
        256.0,
        ge=0,
        description="Memory (MiB) for chat conversation prefixes whose token ids are reused by the next turn "
        "(incremental tokenization; 0 disables).",
    )
    tokenize_prefix_wait_ms: float = Field(
        20.0,
        ge=0,
        description="When a chat turn's new suffix is still being tokenized after this long (ms), route on the "
        "blocks of the conversation prefix already known (0: always wait).",
    )

    def tokenize_of(self) -> dict[str, Any]:
        """These fields as keyword arguments (``up`` hands them to its server's settings)."""
        return {name: getattr(self, name) for name in TokenizeSettings.model_fields}
