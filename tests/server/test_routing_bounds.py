"""Huge prompts cost the router a bounded prefix's worth of tokenizing (issue #28, rows 1–2).

A real ``infera-run serve --router-policy kv-aware`` process in front of a stand-in engine
that refuses every prompt (as vLLM refuses one over the context): 31 MB one-string prompts
used to drive the router to gigabytes (an ``hf`` tokenizer: out of memory) and ``/health``
to seconds; 16 MB prompts refused by the engine each stayed in the token-id cache. Now the
text is cut before it is tokenized and big prompts are not cached: RSS growth and
``/health`` latency stay bounded. RSS is the router process's own (psutil).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from infera_core.testing.attack import attack, big_prompt, refusing_engine, serve_one
from infera_core.testing.tiny_tokenizer import make_tiny_model_dir

MODEL = "m"
MB = 1 << 20


def record(url: str, tokenizer: str) -> dict[str, object]:
    return {
        "worker_id": "w0",
        "url": url,
        "model": MODEL,
        "engine": "sim",
        "labels": {"infera.tokenizer": tokenizer},
    }


def completion(chars: int, seed: int = 0) -> bytes:
    return json.dumps({"model": MODEL, "prompt": big_prompt(chars, seed), "max_tokens": 1}).encode()


def chat(chars: int, seed: int = 0) -> bytes:
    messages = [{"role": "user", "content": big_prompt(chars, seed)}]
    return json.dumps({"model": MODEL, "messages": messages, "max_tokens": 1}).encode()


@pytest.mark.slow
@pytest.mark.parametrize("tokenizer", ["hf", "sim"])
def test_three_31_mb_prompts_leave_the_router_small_and_its_health_fast(
    tmp_path: Path, tokenizer: str
) -> None:
    spec = f"hf:{make_tiny_model_dir(tmp_path / 'tok')}" if tokenizer == "hf" else "sim"
    make = chat if tokenizer == "hf" else completion  # hf: the chat template rendered, then cut
    path = "/v1/chat/completions" if tokenizer == "hf" else "/v1/completions"
    bodies = [make(31 * MB, seed=i) for i in range(3)]
    with (
        refusing_engine() as engine,
        serve_one([record(engine.url, spec)], tmp_path, "--router-policy", "kv-aware") as serve,
    ):
        report = asyncio.run(
            attack(serve.url, serve.proc.pid, bodies, concurrency=3, rss_bound=1200 * MB, path=path)
        )
        print(report.line())
        print(report.detail)
        assert set(report.statuses) == {400}  # the engine's refusal, relayed
        assert engine.requests == 3
        assert report.grew < 1200 * MB, report.line()  # was 23 GB (hf) and 1.6 GB (sim)
        assert report.kept < 150 * MB, report.line()  # was +300 MB (sim)
        assert report.health_max_s < 2.0, report.line()  # was 3.3-10 s; the 31 MB body parse stays
        metrics = httpx.get(serve.url + "/metrics").text
        assert f'infera_routing_tokenize_cut_total{{model="{MODEL}"}} 3.0' in metrics


@pytest.mark.slow
def test_twenty_16_mb_prompts_refused_by_the_engine_are_not_kept(tmp_path: Path) -> None:
    bodies = [completion(16 * MB, seed=i) for i in range(20)]
    with (
        refusing_engine() as engine,
        serve_one([record(engine.url, "sim")], tmp_path, "--router-policy", "kv-aware") as serve,
    ):
        report = asyncio.run(attack(serve.url, serve.proc.pid, bodies, concurrency=2, rss_bound=600 * MB))
        print(report.line())
        print(report.detail)
        assert report.statuses == [400] * 20 and engine.requests == 20
        assert report.kept < 150 * MB, report.line()  # was +79 MB a prompt, 1.7 GB, never freed
        metrics = httpx.get(serve.url + "/metrics").text
        held = next(
            float(line.split()[-1])
            for line in metrics.splitlines()
            if line.startswith("infera_routing_tokenize_cache_bytes")
        )
        assert held == 0.0  # prompts longer than --tokenize-max-chars are not cached
