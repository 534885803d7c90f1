"""Tier credit over real ZMQ frames: blocks vLLM offloads to CPU/storage count with the tier weights.

The frames (``data/kv-events-offload-tiers.jsonl``) are vLLM 0.32's own event classes as its
offloading connector fills them, encoded as its publisher does (``record_offload_frames.py``);
a real sim with a CPU tier (``--cpu-blocks``) publishes the same shapes from a live engine.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import httpx
import pytest
import zmq
from kv_recorded import frames
from prometheus_client import CollectorRegistry

from infera_core.kv import accel
from infera_core.kv.hub import KvHub
from infera_core.kv.index import medium_tier
from infera_core.plugin.hooks import InferaHooks
from infera_core.util.net import free_port
from infera_core.worker import KvEventsInfo, WorkerRecord

BS = 16
P = list(range(1000, 1000 + 4 * BS))  # as in record_offload_frames.py
Q = list(range(2000, 2000 + 2 * BS))
WEIGHTS = (1.0, 0.5, 0.25)
NO_TIER_CREDIT = (1.0, 0.0, 0.0)


async def _until(cond: Callable[[], bool], within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def _hub() -> KvHub:
    return KvHub(InferaHooks.load().catalog(), CollectorRegistry())


def _record(
    endpoint: str,
    worker_id: str = "w0",
    replay: str | None = None,
    url: str = "http://127.0.0.1:9",
    model: str = "m",
) -> WorkerRecord:
    return WorkerRecord(
        worker_id=worker_id,
        url=url,
        model=model,
        engine="vllm",
        kv_events=KvEventsInfo(endpoint=endpoint, replay_endpoint=replay, format="vllm", block_size=BS),
    )


def _score(hub: KvHub, tokens: list[int], weights: tuple[float, float, float] = WEIGHTS) -> float:
    """w0's score for ``tokens``; -1.0 while the router has no view of w0 (no event came yet)."""
    view = hub.index.view("w0", None)
    if view is None:
        return -1.0
    return float(hub.index.match(hub.index.hash_prompt(tokens, BS), [view], weights)[0])


def test_every_engine_medium_maps_to_a_tier() -> None:
    # vLLM: GPU, CPU, STORAGE; SGLang: GPU, CPU_PINNED, DISK, EXTERNAL; LMCache: "cpu"
    assert [medium_tier(m) for m in (None, "GPU", "HBM")] == [0, 0, 0]
    assert [medium_tier(m) for m in ("CPU", "CPU_PINNED", "cpu")] == [1, 1, 1]
    assert [medium_tier(m) for m in ("STORAGE", "DISK", "EXTERNAL", "disk", "something-else")] == [2] * 5


@pytest.mark.parametrize("store", ["native", "python"])
async def test_vllm_offloading_frames_credit_cpu_and_storage_tiers(
    store: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    if store == "python":  # INFERA_KV_NATIVE=0: dict tables, every batch through the decoder
        monkeypatch.setattr(accel, "ops", accel.PYTHON)
    recorded = frames("offload-tiers")
    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)  # XPUB: the subscription shows up, so no frame goes to a slow joiner
    pub.setsockopt(zmq.LINGER, 0)
    port = free_port()
    pub.bind(f"tcp://127.0.0.1:{port}")
    hub = _hub()
    hub.worker_added(_record(f"tcp://127.0.0.1:{port}"))
    await hub.start()
    caplog.set_level(logging.WARNING, "infera.kv.index")
    try:
        await _until(lambda: bool(pub.poll(0)))
        assert pub.recv() == b"\x01kv-events"

        async def send(seq: int) -> None:
            rec = recorded[seq]
            pub.send_multipart([b"kv-events", seq.to_bytes(8, "big"), rec["payload"]])
            await _until(lambda: hub.cache_view("w0")["seq"] == [seq])

        def tiers() -> dict[str, int]:
            tiers: dict[str, int] = hub.cache_view("w0")["views"][0]["blocks_by_tier"]
            return tiers

        await send(0)  # both prompts on the GPU
        assert _score(hub, P) == 4.0 and _score(hub, Q) == 2.0
        await send(1)  # P also offloaded to CPU, in 2 chunks of 2 blocks: the GPU copy counts
        assert tiers() == {"gpu": 6, "cpu": 4, "disk": 0}
        assert _score(hub, P) == 4.0
        await send(2)  # P evicted from the GPU: only its CPU copy is left, at the CPU weight
        assert tiers() == {"gpu": 2, "cpu": 4, "disk": 0}
        assert _score(hub, P) == 4 * 0.5
        assert _score(hub, P, NO_TIER_CREDIT) == 0.0
        assert _score(hub, P + Q) == _score(hub, P)  # the prefix is P's: Q's blocks don't chain on
        await send(3)  # Q: a legacy placeholder CPU store (not indexed), a STORAGE copy, GPU evicted
        assert tiers() == {"gpu": 0, "cpu": 4, "disk": 2}
        assert _score(hub, Q) == 2 * 0.25
        assert hub.cache_view("w0")["views"][0]["block_size_mismatches"] == 1
        assert "self_describing_kv_events" in caplog.text  # the log says how to get real CPU events
        await send(4)  # P's second chunk evicted from the CPU tier
        assert _score(hub, P) == 2 * 0.5
        assert tiers() == {"gpu": 0, "cpu": 2, "disk": 2}
    finally:
        await hub.close()
        pub.close(0)
        ctx.term()


async def test_a_sim_with_a_cpu_tier_is_credited_for_what_it_offloaded() -> None:
    """A live engine: the sim evicts a prompt to its CPU tier; the router scores it at 0.5 a block."""
    sim_testing = pytest.importorskip("infera_sim.testing")
    with sim_testing.start_sim(speedup="inf", block_size=BS, cache_blocks=6, cpu_blocks=64) as sim:
        hub = _hub()
        hub.worker_added(_record(sim.kv_events_endpoint, replay=sim.replay_endpoint))
        await hub.start()
        try:
            a = [1, *range(5000, 5000 + 4 * BS)]
            b = [1, *range(7000, 7000 + 5 * BS)]
            async with httpx.AsyncClient(timeout=10) as client:
                for prompt in (a, b):  # b needs all 6 GPU blocks: a's 4 move to the CPU tier
                    r = await client.post(
                        sim.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 1}
                    )
                    assert r.status_code == 200, r.text
                await _until(lambda: _score(hub, a) == 4 * 0.5)
                assert _score(hub, a, NO_TIER_CREDIT) == 0.0
                assert _score(hub, b) == 5.0
                r = await client.post(sim.url + "/v1/completions", json={"prompt": a, "max_tokens": 1})
                assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 4 * BS
                await _until(lambda: _score(hub, a) == 4.0)  # loaded back: on the GPU again
        finally:
            await hub.close()


async def test_kv_aware_routes_to_the_cpu_copy_and_prefers_a_gpu_one() -> None:
    """Router + 2 live sims with CPU tiers: prompts only on sim-0's CPU tier all go to sim-0
    (loaded back, not recomputed; with no tier credit both would score 0 and alternate);
    once sim-1 holds one on its GPU, sim-1 wins it."""
    sim_testing = pytest.importorskip("infera_sim.testing")
    from contextlib import ExitStack

    from infera_core.kv.component import KvRouting
    from infera_core.kv.settings import KvSettings
    from infera_core.testing.fixtures import make_hooks
    from infera_core.testing.server import serving, settings_for

    flags = {"speedup": "inf", "block_size": BS, "cache_blocks": 8, "cpu_blocks": 64}
    with ExitStack() as stack:
        sims = [stack.enter_context(sim_testing.start_sim(**flags)) for _ in range(2)]
        hooks = make_hooks()
        kv = KvRouting(hooks.catalog(), KvSettings())
        async with serving(settings_for(router_policy="kv-aware"), hooks, kv=kv) as srv:
            for i, sim in enumerate(sims):
                srv.store.put(
                    _record(sim.kv_events_endpoint, f"sim-{i}", sim.replay_endpoint, sim.url, "sim-model")
                )
            await srv.wait_workers(2)
            prompts = [[1, *range(3000 + 1000 * k, 3000 + 1000 * k + 5 * BS)] for k in range(3)]
            p = prompts[0]
            filler = [1, *range(9000, 9000 + 7 * BS)]
            async with httpx.AsyncClient(timeout=10) as client:

                async def complete(url: str, prompt: list[int]) -> int:
                    body = {"model": "sim-model", "prompt": prompt, "max_tokens": 1}
                    r = await client.post(url + "/v1/completions", json=body)
                    assert r.status_code == 200, r.text
                    return int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])

                def score(worker: str, prompt: list[int]) -> float:
                    view = kv.index.view(worker, None)
                    hashes = kv.index.hash_prompt(prompt, BS)
                    return -1.0 if view is None else float(kv.index.match(hashes, [view], WEIGHTS)[0])

                for prompt in (*prompts, filler):  # straight to sim-0: the prompts end up on its CPU tier
                    await complete(sims[0].url, prompt)
                # (-1: sim-1 has no view yet)
                await _until(
                    lambda: all(score("sim-0", q) == 5 * 0.5 and score("sim-1", q) <= 0 for q in prompts)
                )
                for prompt in prompts:  # each routed to sim-0 and loaded from its CPU tier, not recomputed
                    assert await complete(srv.url, prompt) == 5 * BS
                assert [srv.core.table.by_id[f"sim-{i}"].picks for i in range(2)] == [3, 0]
                await complete(sims[0].url, filler)  # sim-0: p back to its CPU tier
                await complete(sims[1].url, p)  # sim-1: p on its GPU
                await _until(lambda: score("sim-0", p) == 5 * 0.5 and score("sim-1", p) == 5.0)
                assert await complete(srv.url, p) == 5 * BS
                assert srv.core.table.by_id["sim-1"].picks == 1
