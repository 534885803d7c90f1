"""One request inside the sim engine: its tokens, blocks, output streams and timing."""

from __future__ import annotations

import asyncio
from typing import Any

from infera_sim.kvcache import Block

_LCG_A = 6364136223846793005
_LCG_C = 1442695040888963407
_MASK64 = (1 << 64) - 1


WINDOW = 8
"""How many of the latest tokens (prompt, then output) decide the next one."""


class Choice:
    """One output sequence (``n`` of them per request) with a deterministic generator.

    The next token is a function of the seed, the choice's index and the last
    :data:`WINDOW` tokens of prompt + output only (like a greedy engine, whose next token
    depends on the context, not on how the context was sent): a request whose prompt is
    another's prompt + the first k tokens of its output continues that output exactly.
    """

    __slots__ = ("finish_reason", "salt", "text", "tokens", "window")

    def __init__(self, salt: int, context: list[int]) -> None:
        self.salt = salt
        self.window = context[-WINDOW:]
        self.tokens: list[int] = []
        self.text = ""
        self.finish_reason: str | None = None

    def next_random(self) -> int:
        state = ((hash(tuple(self.window)) ^ self.salt) * _LCG_A + _LCG_C) & _MASK64
        state = ((state ^ (state >> 29)) * _LCG_A + _LCG_C) & _MASK64
        return state >> 11

    def push(self, token: int) -> None:
        """``token`` was generated: it joins the output and the context window."""
        self.tokens.append(token)
        window = self.window
        window.append(token)
        if len(window) > WINDOW:
            del window[0]


class SimRequest:
    """What the engine schedules. The HTTP handler waits on :attr:`wake` for new output."""

    __slots__ = (
        "arrival",
        "blocks",
        "cache_salt",
        "choices",
        "committed",
        "done",
        "first_token_at",
        "hashes",
        "ignore_eos",
        "last_token_at",
        "lora",
        "max_tokens",
        "min_tokens",
        "num_cached",
        "num_computed",
        "output",
        "pd",
        "priority",
        "prompt",
        "request_id",
        "stop",
        "stop_token_ids",
        "stream",
        "target",
        "wake",
    )

    def __init__(
        self,
        request_id: str,
        prompt: list[int],
        max_tokens: int,
        *,
        n: int = 1,
        seed: int = 0,
        min_tokens: int = 0,
        ignore_eos: bool = False,
        stop: list[str] | None = None,
        stop_token_ids: list[int] | None = None,
        cache_salt: str | None = None,
        lora: tuple[str, int] | None = None,
        priority: int = 0,
    ) -> None:
        self.request_id = request_id
        self.priority = priority
        """vLLM's ``priority`` (lower first) under ``--scheduling-policy priority``."""
        self.cache_salt = cache_salt
        """Folded into the first block's hash (vLLM's ``cache_salt``)."""
        self.lora = lora
        """The LoRA adapter (name, id) it runs with: its blocks are the adapter's own."""
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.min_tokens = min_tokens
        self.ignore_eos = ignore_eos
        self.stop = stop or []
        self.stop_token_ids = set(stop_token_ids or ())
        base = (seed * 0x9E3779B97F4A7C15) & _MASK64
        self.choices = [Choice((base + 0x632BE59BD9B4E019 * (i + 1)) & _MASK64, prompt) for i in range(n)]
        self.blocks: list[Block] = []
        self.hashes: list[int] = []
        """Hashes of the full blocks committed so far (prompt, then choice 0's output)."""
        self.committed = 0
        """How many of :attr:`blocks` are cached (hashed and announced)."""
        self.num_cached = 0
        self.num_computed = 0
        self.target = len(prompt)
        """Tokens to compute before generating: the prompt, or prompt + output after a preemption."""
        self.arrival = 0.0
        self.first_token_at: float | None = None
        self.last_token_at = 0.0
        self.output: list[tuple[int, int, str, str | None]] = []
        """(choice index, token id, text, finish reason) produced since the handler last looked."""
        self.done = False
        self.wake = asyncio.Event()
        self.stream = True
        """False: the handler only wants the finished request (no per-token wake-ups/output)."""
        self.pd: dict[str, Any] | None = None
        """PD state: received KV (decode side) or what to publish (prefill side)."""

    @property
    def prefilling(self) -> bool:
        return self.num_computed < self.target

    @property
    def num_generated(self) -> int:
        return len(self.choices[0].tokens)

    def all_tokens(self) -> list[int]:
        return self.prompt + self.choices[0].tokens

    def take_output(self) -> list[tuple[int, int, str, str | None]]:
        out, self.output = self.output, []
        self.wake.clear()
        return out
