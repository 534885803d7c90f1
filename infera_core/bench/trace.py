"""Mooncake trace replay: JSONL rows → token-id prompts with their arrival times.

Each row has ``timestamp`` (ms from the start), ``input_length``, ``output_length``
and ``hash_ids``: one id per 512-token block of the prompt. Two rows sharing a hash id
share that block, so every hash id maps deterministically to the same 512 token ids
(a seeded generator keyed by the id); the prompt is the concatenation of its blocks,
cut to ``input_length``. A prompt longer than its blocks is padded with tokens unique
to that row. Prompts are sent as token ids to ``/v1/completions``.
"""

from __future__ import annotations

import json
import random
from array import array
from collections.abc import Iterator
from pathlib import Path

from infera_core.bench.workloads import Session, Turn
from infera_core.errors import ConfigError

TRACE_BLOCK_TOKENS = 512
DEFAULT_VOCAB_SIZE = 32000
_FIRST_TOKEN_ID = 10
"""Low ids are left out (they are often special tokens in real vocabularies)."""


class BlockTokens:
    """hash id → the same 512 token ids every time (cached)."""

    __slots__ = ("_cache", "block_tokens", "seed", "vocab_size")

    def __init__(
        self, seed: int = 0, vocab_size: int = DEFAULT_VOCAB_SIZE, block_tokens: int = TRACE_BLOCK_TOKENS
    ) -> None:
        if vocab_size <= _FIRST_TOKEN_ID + 1:
            raise ConfigError(f"--vocab-size must be > {_FIRST_TOKEN_ID + 1} (got {vocab_size})")
        self.seed = seed
        self.vocab_size = vocab_size
        self.block_tokens = block_tokens
        self._cache: dict[int, list[int]] = {}

    def block(self, hash_id: int) -> list[int]:
        got = self._cache.get(hash_id)
        if got is None:
            got = self._generate(("block", self.seed, hash_id))
            self._cache[hash_id] = got
        return got

    def unique(self, row: int, n: int) -> list[int]:
        """``n`` tokens that belong to one trace row only (padding)."""
        out: list[int] = []
        k = 0
        while len(out) < n:
            out.extend(self._generate(("pad", self.seed, row, k)))
            k += 1
        return out[:n]

    def _generate(self, key: tuple[object, ...]) -> list[int]:
        rng = random.Random(repr(key))
        raw = rng.getrandbits(32 * self.block_tokens).to_bytes(4 * self.block_tokens, "little")
        words = array("I")
        words.frombytes(raw)
        span = self.vocab_size - _FIRST_TOKEN_ID
        return [_FIRST_TOKEN_ID + w % span for w in words]

    def prompt(self, hash_ids: list[int], input_length: int, row: int) -> list[int]:
        tokens: list[int] = []
        for h in hash_ids:
            if len(tokens) >= input_length:
                break
            tokens.extend(self.block(h))
        if len(tokens) < input_length:
            tokens.extend(self.unique(row, input_length - len(tokens)))
        return tokens[:input_length]


def read_trace(path: str | Path, max_requests: int | None = None) -> Iterator[dict[str, object]]:
    """Rows of a Mooncake JSONL trace (validated), at most ``max_requests``."""
    p = Path(path)
    try:
        fh = p.open()
    except OSError as exc:
        raise ConfigError(f"--trace {p}: cannot read file ({exc.strerror})") from None
    with fh:
        n = 0
        for lineno, line in enumerate(fh, 1):
            if max_requests is not None and n >= max_requests:
                return
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise ValueError("not an object")
                _ = float(row["timestamp"]), int(row["input_length"]), int(row["output_length"])
                if not isinstance(row.get("hash_ids", []), list):
                    raise ValueError("hash_ids is not a list")
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigError(
                    f"--trace {p}:{lineno}: not a Mooncake row "
                    f"(need timestamp, input_length, output_length, hash_ids): {exc}"
                ) from None
            n += 1
            yield row


def trace_workload(
    path: str | Path,
    max_requests: int | None = None,
    time_scale: float = 1.0,
    seed: int = 0,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    use_timestamps: bool = True,
    max_output_len: int | None = None,
    block_tokens: int = TRACE_BLOCK_TOKENS,
) -> list[Session]:
    """Sessions for a trace: token-id prompts, arrival = ``timestamp`` × ``time_scale`` (s).

    ``time_scale`` 0.1 replays ten times faster than recorded; ``block_tokens`` below 512 makes
    each trace block (and each input length) that many tokens instead (a smaller engine's scale).
    """
    if time_scale < 0:
        raise ConfigError(f"--time-scale must be >= 0 (got {time_scale})")
    if block_tokens < 1:
        raise ConfigError(f"--tokens-per-block must be >= 1 (got {block_tokens})")
    blocks = BlockTokens(seed=seed, vocab_size=vocab_size, block_tokens=block_tokens)
    rows = list(read_trace(path, max_requests))
    if not rows:
        raise ConfigError(f"--trace {path}: no requests in the file")
    t0 = min(float(str(r["timestamp"])) for r in rows)
    out: list[Session] = []
    for i, r in enumerate(rows):
        ids = [int(h) for h in r.get("hash_ids", []) or []]  # type: ignore[attr-defined]
        n_in = max(1, int(str(r["input_length"])) * block_tokens // TRACE_BLOCK_TOKENS)
        n_out = max(1, int(str(r["output_length"])))
        if max_output_len is not None:
            n_out = min(n_out, max_output_len)
        at = (float(str(r["timestamp"])) - t0) / 1000.0 * time_scale if use_timestamps else None
        turn = Turn(blocks.prompt(ids, n_in, i), n_out)
        out.append(Session([turn], at=at, api="completions", session_id=i))
    out.sort(key=lambda s: s.at or 0.0)
    return out
