"""End to end: server + KvRouting + 4 real sim engines (ZMQ KV events), kv-aware vs round-robin.

Shared-prefix workload (16 groups × 12 questions, prefix ≫ question) under cache pressure; the
sims report prefix-cache hits on their own ``/metrics`` and the client measures TTFT.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import pytest

from infera_core.kv.component import KvRouting
from infera_core.kv.settings import KvSettings
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import serving, settings_for, until

sim_testing = pytest.importorskip("infera_sim.testing")
sim_metrics = pytest.importorskip("infera_sim.metrics")

BS = 16
MODEL = "sim-model"


@pytest.fixture
def sims() -> Iterator[list[Any]]:
    # each sim holds ~5 of the workload's 16 prefixes: round robin (every prefix everywhere) thrashes;
    # prefill is slow enough (a miss ≈ 0.2 s) that TTFT reflects cache hits, not CPU contention
    flags = {"block_size": BS, "cache_blocks": 5 * 22, "prefill_tokens_per_s": 1500}
    with ExitStack() as stack:
        yield [stack.enter_context(sim_testing.start_sim(**flags)) for _ in range(4)]


def _workload(groups: int, per_group: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = [f"w{rng.randrange(10**6)}" for _ in range(5000)]
    prefixes = [" ".join(rng.choice(words) for _ in range(320)) for _ in range(groups)]
    prompts = [
        f"{p} question {q}: " + " ".join(rng.choice(words) for _ in range(12))
        for p in prefixes
        for q in range(per_group)
    ]
    rng.shuffle(prompts)
    return prompts


async def _hits(client: httpx.AsyncClient, sims: list[Any]) -> tuple[float, float]:
    hits = queries = 0.0
    for sim in sims:
        text = (await client.get(sim.url + "/metrics")).text
        vals = sim_metrics.parse_gauges(
            text, ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")
        )
        hits += vals.get("vllm:prefix_cache_hits_total", 0.0)
        queries += vals.get("vllm:prefix_cache_queries_total", 0.0)
    return hits, queries


async def _run(policy: str, sims: list[Any], prompts: list[str], concurrency: int = 6) -> dict[str, Any]:
    hooks = make_hooks()
    kv = KvRouting(hooks.catalog(), KvSettings())
    async with serving(settings_for(router_policy=policy), hooks, kv=kv) as srv:
        for i, sim in enumerate(sims):
            srv.store.put(sim.record(f"sim-{i}"))
        await srv.wait_workers(4)
        ttfts: list[float] = []
        sem = asyncio.Semaphore(concurrency)
        async with httpx.AsyncClient(timeout=30) as client:
            h0, q0 = await _hits(client, sims)

            async def one(prompt: str) -> None:
                async with sem:
                    t0 = time.perf_counter()
                    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2, "stream": True}
                    async with client.stream("POST", srv.url + "/v1/completions", json=body) as r:
                        assert r.status_code == 200
                        first: float | None = None
                        async for _ in r.aiter_bytes():
                            if first is None:
                                first = time.perf_counter() - t0
                        assert first is not None
                        ttfts.append(first)
                    await asyncio.sleep(0.01)  # give KV events a moment, as real traffic would

            await asyncio.gather(*(one(p) for p in prompts))
            h1, q1 = await _hits(client, sims)
            picks = [srv.core.table.by_id[f"sim-{i}"].picks for i in range(4)]
            views = (await client.get(srv.url + "/v1/admin/cache-view/sim-0")).json()
        ttfts.sort()
        return {
            "hit": (h1 - h0) / max(1.0, q1 - q0),
            "p90": ttfts[int(0.9 * (len(ttfts) - 1))],
            "imbalance": max(picks) / (sum(picks) / len(picks)),
            "picks": picks,
            "view": views,
        }


@pytest.mark.slow
async def test_kv_aware_beats_round_robin_with_real_sims(sims: list[Any]) -> None:
    prompts = _workload(16, 12)  # cold misses 16/192 < 10%: kv-aware's p90 is a cache hit
    rr = await _run("round-robin", sims, prompts)
    async with httpx.AsyncClient(timeout=5) as client:  # fresh caches for the second run
        for sim in sims:
            await client.post(sim.url + "/reset_prefix_cache")
    kv = await _run("kv-aware", sims, prompts)
    report = {"kv-aware": {k: kv[k] for k in ("hit", "p90", "imbalance", "picks")}, "round-robin": rr}
    print("kv e2e", report)
    assert kv["hit"] > 1.5 * rr["hit"], report
    assert kv["p90"] < rr["p90"], report
    assert kv["imbalance"] <= 1.5, report
    view = kv["view"]
    assert view["blocks"] > 0 and view["stale"] is False and view["publishers"][0]["batches"] > 0


@pytest.mark.slow
async def test_one_shared_system_prompt_spreads_over_the_fleet(sims: list[Any]) -> None:
    rng = random.Random(5)
    system = " ".join(f"s{rng.randrange(10**6)}" for _ in range(300))
    prompts = [
        f"{system} user {i}: " + " ".join(f"q{rng.randrange(10**6)}" for _ in range(10)) for i in range(60)
    ]
    res = await _run("kv-aware", sims, prompts, concurrency=2)
    assert min(res["picks"]) > 0, res
    assert res["imbalance"] <= 1.5, res
    assert res["hit"] > 0.5, res  # still cache-friendly: the system prompt is cached where it goes


async def test_cache_view_endpoint_and_workers_field(sims: list[Any]) -> None:
    hooks = make_hooks()
    kv = KvRouting(hooks.catalog(), KvSettings(kv_block_size=[f"{MODEL}=32"]))
    async with serving(settings_for(router_policy="kv-aware"), hooks, kv=kv) as srv:
        srv.store.put(sims[0].record("sim-0"))
        await srv.wait_workers(1)
        async with httpx.AsyncClient(timeout=10) as client:
            r = await client.post(
                srv.url + "/v1/completions", json={"model": MODEL, "prompt": "hello " * 80, "max_tokens": 1}
            )
            assert r.status_code == 200
            await until(lambda: kv.hub.cache_view("sim-0")["blocks"] > 0, within=5)
            view = (await client.get(srv.url + "/v1/admin/cache-view/sim-0")).json()
            assert view["blocks"] > 0 and view["seq"] and view["mismatch"]
            missing = await client.get(srv.url + "/v1/admin/cache-view/nope")
            assert missing.status_code == 404 and missing.json()["error"]["code"] == "worker_not_found"
            workers = (await client.get(srv.url + "/v1/workers")).json()["data"]
            assert "block_size 16" in workers[0]["kv_mismatch"][0]
            metrics = (await client.get(srv.url + "/metrics")).text
            assert 'infera_kv_worker_mismatch{reason="block_size",worker="sim-0"} 1.0' in metrics
            assert "infera_kv_events_applied_total" in metrics
