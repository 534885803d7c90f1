"""The sim's CPU tier (``--cpu-blocks``): GPU evictions move there, hits load back, events say where."""

from __future__ import annotations

import asyncio
import time

import httpx
import msgspec
import pytest
import zmq
from infera_sim.config import SimConfig, parse_args
from infera_sim.engine import SimEngine
from infera_sim.kvcache import KvCache, block_hashes
from infera_sim.metrics import parse_gauges
from infera_sim.request import SimRequest
from infera_sim.testing import run_requests, start_sim, ttft
from infera_sim.tokenizer import SimTokenizer

from infera_core.kv.decode import MsgpackEventDecoder
from infera_core.kv.events import BlockRemoved, BlockStored, KvEvent

BS = 16


def _prompt(seed: int, blocks: int) -> list[int]:
    """``blocks`` full blocks and one token more (the last token is always computed)."""
    return [1, *range(1000 * seed, 1000 * seed + blocks * BS)]


def _engine(events: list[KvEvent], **kw: float) -> SimEngine:
    cfg = SimConfig(
        speedup=float("inf"),
        block_size=BS,
        cache_blocks=10,
        cpu_blocks=int(kw.pop("cpu_blocks", 32)),
        prefill_tokens_per_s=10_000,
        cpu_load_tokens_per_s=100_000,
        itl_base_ms=1,
        itl_slope_ms=0,
        **kw,  # type: ignore[arg-type]
    )
    return SimEngine(cfg, SimTokenizer(1000), lambda ts, evs: events.extend(evs))


def _by_medium(events: list[KvEvent], kind: type, medium: str) -> list[int | bytes]:
    return [h for e in events if isinstance(e, kind) and e.medium == medium for h in e.block_hashes]


def test_evicted_blocks_move_to_cpu_and_a_cpu_hit_loads_them_back() -> None:
    events: list[KvEvent] = []
    engine = _engine(events)
    a = _prompt(1, 8)
    first, filler, again = SimRequest("a", a, 1), SimRequest("b", _prompt(2, 9), 1), SimRequest("a2", a, 1)
    asyncio.run(run_requests(engine, [first, filler], one_by_one=True))
    a_hashes = block_hashes(a, BS)
    # the filler needed every GPU block: a's blocks left the GPU and went to the CPU
    assert set(a_hashes) <= set(_by_medium(events, BlockRemoved, "GPU"))
    assert set(a_hashes) <= set(_by_medium(events, BlockStored, "CPU"))
    assert set(a_hashes) <= engine.cache.cpu.contents()  # type: ignore[union-attr]
    # each CPU store says what a subscriber needs to hash it: parent and token ids
    by_hash = {e.block_hashes[0]: e for e in events if isinstance(e, BlockStored) and e.medium == "CPU"}
    for i, h in enumerate(a_hashes):
        ev = by_hash[h]
        assert ev.parent_block_hash == (a_hashes[i - 1] if i else None)
        assert ev.token_ids == a[i * BS : (i + 1) * BS] and ev.block_size == BS
    events.clear()
    asyncio.run(run_requests(engine, [again], one_by_one=True))
    assert again.num_cached == 8 * BS  # served from the CPU tier, nothing recomputed but the last token
    assert set(_by_medium(events, BlockRemoved, "CPU")) >= set(a_hashes)
    assert set(_by_medium(events, BlockStored, "GPU")) >= set(a_hashes)
    assert not set(a_hashes) & engine.cache.cpu.contents()  # type: ignore[union-attr]
    assert set(a_hashes) <= engine.cache.contents()
    m = engine.metrics
    assert m.external_hits == 8 * BS and m.prefix_hits == 0


def test_a_cpu_hit_costs_the_transfer_less_than_prefill_more_than_a_gpu_hit() -> None:
    events: list[KvEvent] = []
    engine = _engine(events)
    a = _prompt(1, 8)
    cold, gpu_hit = SimRequest("cold", a, 1), SimRequest("gpu", a, 1)
    filler, cpu_hit = SimRequest("fill", _prompt(2, 9), 1), SimRequest("cpu", a, 1)
    asyncio.run(run_requests(engine, [cold, gpu_hit, filler, cpu_hit], one_by_one=True))
    assert gpu_hit.num_cached == cpu_hit.num_cached == 8 * BS
    prefill, load, last = 129 / 10_000, 128 / 100_000, 1 / 10_000
    assert ttft(cold) == pytest.approx(prefill)
    assert ttft(gpu_hit) == pytest.approx(last)
    assert ttft(cpu_hit) == pytest.approx(last + load)
    assert ttft(gpu_hit) < ttft(cpu_hit) < ttft(cold)


def test_a_full_cpu_tier_drops_its_least_recently_used_block() -> None:
    cache = KvCache(1, BS, cpu_blocks=2)
    hashes = []
    for seed in range(4):
        toks = _prompt(seed, 1)[:BS]
        (blk,) = cache.allocate(1)
        hashes += block_hashes(toks, BS)
        cache.commit([blk], 0, hashes[-1:], None, toks)
        cache.release([blk])
    # GPU holds the 4th, the CPU tier the 2nd and 3rd; the 1st went first
    assert cache.contents() == {hashes[3]}
    assert cache.cpu is not None and cache.cpu.contents() == {hashes[1], hashes[2]}
    assert _by_medium(cache.events, BlockRemoved, "CPU") == [hashes[0]]


def test_flags() -> None:
    cfg = parse_args(["--cpu-blocks", "64", "--cpu-load-tokens-per-s", "5e5"])
    assert cfg.cpu_blocks == 64 and cfg.cpu_load_tokens_per_s == 5e5
    assert SimConfig().cpu_blocks == 0
    with pytest.raises(SystemExit):
        parse_args(["--cpu-blocks", "-1"])
    with pytest.raises(SystemExit):
        parse_args(["--cpu-load-tokens-per-s", "0"])


def test_server_publishes_cpu_tier_frames_and_metrics() -> None:
    """A real sim process: its ZMQ frames carry medium CPU; /metrics has vLLM's connector counters."""
    with start_sim(speedup="inf", cache_blocks=10, cpu_blocks=32, block_size=BS) as sim:
        assert sim.kv_events_endpoint is not None
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.connect(sim.kv_events_endpoint)
        sub.setsockopt(zmq.SUBSCRIBE, b"kv-events")
        decoder = MsgpackEventDecoder("vllm")
        seen: list[KvEvent] = []
        try:
            with httpx.Client(timeout=10) as client:
                probe = _prompt(9, 1)
                deadline = time.monotonic() + 10
                while not sub.poll(100):  # slow joiner: send until the subscription is live
                    assert time.monotonic() < deadline
                    client.post(sim.url + "/v1/completions", json={"prompt": probe, "max_tokens": 1})
                a = _prompt(1, 8)
                for prompt in (a, _prompt(2, 9), a):
                    r = client.post(sim.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1})
                    assert r.status_code == 200, r.text
                metrics = client.get(sim.url + "/metrics").text
                cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            want = set(block_hashes(a, BS))
            deadline = time.monotonic() + 10
            while not want <= set(_by_medium(seen, BlockRemoved, "CPU")):
                assert time.monotonic() < deadline, seen
                if sub.poll(200):
                    _topic, _seq, payload = sub.recv_multipart()
                    assert msgspec.msgpack.decode(payload)[1]  # a batch of events
                    seen += decoder.decode(payload).events
        finally:
            sub.close(0)
            ctx.term()
    assert want <= set(_by_medium(seen, BlockStored, "CPU"))
    assert cached == 8 * BS
    counters = parse_gauges(
        metrics, ("vllm:external_prefix_cache_hits_total", "vllm:external_prefix_cache_queries_total")
    )
    assert counters["vllm:external_prefix_cache_hits_total"] == 8 * BS
    assert counters["vllm:external_prefix_cache_queries_total"] > 8 * BS
