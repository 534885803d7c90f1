"""Request traces shipped in ``bench/data/`` (source and license: ``bench/data/README.md``)."""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"

#: The Mooncake FAST'25 synthetic trace (Apache-2.0): timestamp, input_length,
#: output_length, hash_ids (one id per 512-token prefix block).
MOONCAKE_TRACE = DATA / "mooncake_synthetic_trace.jsonl"
