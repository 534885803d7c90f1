"""Prefix reuse and the timing model: cached tokens, TTFT, queueing, batching, ITL."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
from infera_sim.config import SimConfig
from infera_sim.engine import SimEngine
from infera_sim.metrics import parse_gauges
from infera_sim.request import SimRequest
from infera_sim.testing import run_requests, start_sim, ttft
from infera_sim.tokenizer import SimTokenizer

from infera_core.kv.events import KvEvent

PROMPT = " ".join(f"w{i % 97}" for i in range(150)) + " end"


def _ttft_stream(client: httpx.Client, url: str) -> tuple[float, dict[str, int]]:
    body = {
        "prompt": PROMPT,
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first = None
    usage: dict[str, int] = {}
    with client.stream("POST", url + "/v1/completions", json=body, timeout=10) as resp:
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            if first is None:
                first = time.perf_counter() - start
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = {
                    "prompt": chunk["usage"]["prompt_tokens"],
                    "cached": chunk["usage"]["prompt_tokens_details"]["cached_tokens"],
                }
    assert first is not None
    return first, usage


def test_second_identical_prompt_hits_the_cache_and_starts_sooner() -> None:
    # one client: creating an httpx client costs ~0.1 s (TLS setup)
    with start_sim(speedup=1, prefill_tokens_per_s=600, itl_base_ms=1) as sim, httpx.Client() as client:
        client.get(sim.url + "/health")
        ttft1, u1 = _ttft_stream(client, sim.url)
        ttft2, u2 = _ttft_stream(client, sim.url)
        metrics = client.get(sim.url + "/metrics").text
    assert u1["cached"] == 0
    prompt = u1["prompt"]
    full_blocks = (prompt - 1) // 16 * 16  # like vLLM, at least one token is always recomputed
    assert u2 == {"prompt": prompt, "cached": full_blocks}
    assert prompt - full_blocks <= 16
    assert ttft1 > 0.2 and ttft2 < ttft1 / 2, (ttft1, ttft2)  # ~0.25 s vs ~0.01 s simulated
    hits = parse_gauges(metrics, ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"))
    assert hits == {
        "vllm:prefix_cache_hits_total": full_blocks,
        "vllm:prefix_cache_queries_total": 2 * prompt,
    }
    names = ("vllm:time_to_first_token_seconds_count", "vllm:inter_token_latency_seconds_count")
    assert parse_gauges(metrics, names) == {names[0]: 2, names[1]: 4}


async def _run_engine(cfg: SimConfig, reqs: list[SimRequest]) -> None:
    events: list[KvEvent] = []
    await run_requests(SimEngine(cfg, SimTokenizer(1000), lambda ts, evs: events.extend(evs)), reqs)


def test_max_num_seqs_queues_requests() -> None:
    cfg = SimConfig(
        speedup=float("inf"), max_num_seqs=1, itl_base_ms=10, itl_slope_ms=0, prefill_tokens_per_s=1e5
    )
    reqs = [SimRequest(f"r{i}", [1, *range(100 + 200 * i, 300 + 200 * i)], 10) for i in range(3)]
    asyncio.run(_run_engine(cfg, reqs))
    one_request = 9 * 0.010  # nine decode steps after the first token
    assert ttft(reqs[0]) < 0.01
    assert ttft(reqs[1]) >= one_request
    assert ttft(reqs[2]) >= 2 * one_request
    assert all(len(r.choices[0].tokens) == 10 for r in reqs)


def test_itl_grows_with_running_requests_and_prefill_is_chunked() -> None:
    cfg = SimConfig(speedup=float("inf"), itl_base_ms=5, itl_slope_ms=1, prefill_tokens_per_s=1e4)
    alone = SimRequest("alone", [1, *range(10, 40)], 20)
    asyncio.run(_run_engine(cfg, [alone]))
    crowd = [SimRequest(f"c{i}", [1, *range(10 + 50 * i, 40 + 50 * i)], 20) for i in range(30)]
    asyncio.run(_run_engine(cfg, crowd))

    def itl(r: SimRequest) -> float:
        assert r.first_token_at is not None
        return (r.last_token_at - r.first_token_at) / 19

    assert itl(crowd[0]) > 3 * itl(alone)
    # chunked prefill: with a 64-token budget a 640-token prompt takes >= 10 steps
    chunked = SimConfig(speedup=float("inf"), max_num_batched_tokens=64, prefill_tokens_per_s=1e4)
    long = SimRequest("long", [1, *range(5, 644)], 2)
    engine_steps: list[int] = []

    async def run() -> None:
        engine = SimEngine(chunked, SimTokenizer(1000))
        task = asyncio.get_running_loop().create_task(engine.run())
        engine.add(long)
        while not long.done:
            await long.wake.wait()
            long.wake.clear()
        engine_steps.append(engine.steps)
        task.cancel()

    asyncio.run(run())
    assert engine_steps[0] >= 10
    assert abs(ttft(long) - 640 / 1e4) < 1e-6


def test_outputs_are_deterministic_for_a_seed() -> None:
    cfg = SimConfig(speedup=float("inf"))
    a = [SimRequest("a", [1, 5, 6, 7], 12, seed=4), SimRequest("b", [1, 5, 6, 7], 12, seed=5)]
    b = [SimRequest("a", [1, 5, 6, 7], 12, seed=4)]
    asyncio.run(_run_engine(cfg, a))
    asyncio.run(_run_engine(cfg, b))
    assert a[0].choices[0].tokens == b[0].choices[0].tokens
    assert a[0].choices[0].tokens != a[1].choices[0].tokens
