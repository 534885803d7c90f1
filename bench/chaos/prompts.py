"""Chaos scenario: huge prompts against a kv-aware router (issue #28, rows 1–2; see ``run.py``).

Its own router (``infera-run serve --router-policy kv-aware``, sim tokenizer, one process)
in front of a stand-in engine that refuses every prompt, so only the router's own work is
measured: its RSS (psutil) and ``/health`` latency while the prompts are sent.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path

from bench.chaos.stack import ChaosStack, Row, codes_text, scenario
from infera_core.testing.attack import attack, big_prompt, refusing_engine, serve_one

MB = 1 << 20


def _body(chars: int, seed: int) -> bytes:
    return json.dumps({"model": "m", "prompt": big_prompt(chars, seed), "max_tokens": 1}).encode()


def _huge_prompts() -> Row:
    with tempfile.TemporaryDirectory() as d, refusing_engine() as engine:
        labels = {"infera.tokenizer": "sim"}
        record = {"worker_id": "w0", "url": engine.url, "model": "m", "engine": "sim", "labels": labels}
        with serve_one([record], Path(d), "--router-policy", "kv-aware") as serve:
            big = asyncio.run(
                attack(serve.url, serve.proc.pid, [_body(31 * MB, i) for i in range(3)], 3, 4 << 30)
            )
            many = [_body(16 * MB, 10 + i) for i in range(20)]
            refused = asyncio.run(attack(serve.url, serve.proc.pid, many, 2, 4 << 30))
    ok = big.grew < 1200 * MB and big.kept < 150 * MB and refused.kept < 150 * MB and big.health_max_s < 2
    return Row(
        "3 concurrent 31 MB one-string prompts, then 20 distinct 16 MB prompts the engine refuses,"
        " to `serve --router-policy kv-aware` (sim tokenizer)",
        f"{codes_text(big.statuses + refused.statuses)} (the engine's refusal); /health worst"
        f" {big.health_max_s * 1e3:.0f} ms and {refused.health_max_s * 1e3:.0f} ms",
        f"nothing; router RSS peak +{big.grew / MB:.0f} MB, kept {big.kept / MB:+.0f} MB after the 31 MB"
        f" prompts, {refused.kept / MB:+.0f} MB after the 16 MB ones",
        ok,
    )


@scenario(fast=False)
async def huge_prompts(stack: ChaosStack) -> Row:
    del stack  # its own router and engine: the tokenizer's bounds, measured alone
    return await asyncio.to_thread(_huge_prompts)
