"""The router queue, live: a real ``infera-run serve`` in front of two real sims over HTTP.

``--max-inflight-per-worker 1``: two requests run, the rest wait in the router queue and are
dispatched as slots free (no polling: ``--processes 1``). Checked: 12 concurrent requests are
all served (before the queue, 10 were refused); a light key is not starved by a flooding
one; a deadline the queue cannot meet is answered before it passes; a full queue gives up
its newest sheddable waiter for a critical request; the queue's series on ``/metrics``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from infera_sim.testing import SimHandle, start_sims

from infera_core.testing.pd import metric_sum
from infera_core.testing.serve_processes import ServeProcesses, poll, serve_processes

KEYS = {
    "keys": [
        {"name": "a", "key": "sk-a"},
        {"name": "b", "key": "sk-b"},
        {"name": "bulk", "key": "sk-bulk", "priority": "sheddable"},
        {"name": "vip", "key": "sk-vip", "priority": "critical"},
    ]
}
ITL_MS = 20.0
TOKENS = 10
"""Each request holds its worker for about TOKENS × ITL_MS (0.2 s)."""


@pytest.fixture(scope="module")
def sims() -> Iterator[list[SimHandle]]:
    with start_sims(2, itl_base_ms=ITL_MS, kv_events_port=None, kv_replay_port=None) as out:
        yield out


def _serve(sims: list[SimHandle], directory: Path, *args: str) -> Any:
    keys = directory / "keys.yaml"
    keys.write_text(yaml.safe_dump(KEYS))
    workers = [{"worker_id": f"s{i}", "url": s.url, "model": s.info["model"]} for i, s in enumerate(sims)]
    flags = ("--router-policy", "round-robin", "--max-inflight-per-worker", "1", "--api-key-file", str(keys))
    return serve_processes(workers, directory, *flags, *args, processes=1)


@pytest.fixture(scope="module")
def serve(sims: list[SimHandle], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcesses]:
    with _serve(sims, tmp_path_factory.mktemp("queue"), "--queue-max", "64") as s:
        yield s


async def _post(
    c: httpx.AsyncClient, model: str, key: str, done: list[str] | None = None, **headers: str
) -> httpx.Response:
    body = {"model": model, "prompt": "hello there", "max_tokens": TOKENS}
    r = await c.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}", **headers})
    if done is not None:
        done.append(key)
    return r


async def _until_metric(c: httpx.AsyncClient, name: str, at_least: float) -> None:
    """Until the router's own count ``name`` reaches ``at_least`` (a condition, not a sleep)."""
    async with asyncio.timeout(30):
        while metric_sum((await c.get("/metrics")).text, name) < at_least:  # noqa: ASYNC110 (another process)
            await asyncio.sleep(0.02)


async def _until_queued(c: httpx.AsyncClient, n: int) -> None:
    await _until_metric(c, "infera_queue_depth", n)


async def test_twelve_concurrent_requests_on_two_capped_workers_are_all_served(
    serve: ServeProcesses, sims: list[SimHandle]
) -> None:
    model = sims[0].info["model"]
    async with httpx.AsyncClient(base_url=serve.url, timeout=60) as c:
        results = await asyncio.gather(*(_post(c, model, "sk-a") for _ in range(12)))
        assert [r.status_code for r in results] == [200] * 12, [
            r.text for r in results if r.status_code != 200
        ]
        text = (await c.get("/metrics")).text
        assert metric_sum(text, "infera_queue_wait_seconds_count", tier="standard") >= 9
        assert metric_sum(text, "infera_queue_served_cost_total", key="a") > 0


async def test_a_light_key_is_served_ahead_of_a_flooding_key(
    serve: ServeProcesses, sims: list[SimHandle]
) -> None:
    model = sims[0].info["model"]
    done: list[str] = []
    async with httpx.AsyncClient(base_url=serve.url, timeout=60) as c:
        flood = [asyncio.ensure_future(_post(c, model, "sk-a", done)) for _ in range(10)]
        await _until_queued(c, 8)
        light = [asyncio.ensure_future(_post(c, model, "sk-b", done)) for _ in range(2)]
        results = await asyncio.gather(*flood, *light)
    assert all(r.status_code == 200 for r in results)
    # first come, first served would finish b's two last; the fair queue puts each of them
    # behind at most one of a's waiting requests
    last_b = max(i for i, k in enumerate(done) if k == "sk-b")
    assert last_b <= 6, done


async def test_a_deadline_the_queue_cannot_meet_is_answered_before_it(
    serve: ServeProcesses, sims: list[SimHandle]
) -> None:
    model = sims[0].info["model"]
    async with httpx.AsyncClient(base_url=serve.url, timeout=60) as c:
        waited = metric_sum((await c.get("/metrics")).text, "infera_queue_wait_seconds_count")
        flood = [asyncio.ensure_future(_post(c, model, "sk-a")) for _ in range(12)]
        await _until_queued(c, 8)
        # two dispatches from the queue: its rate is measured
        await _until_metric(c, "infera_queue_wait_seconds_count", waited + 2)
        deadline_ms = 300.0
        t0 = time.perf_counter()
        r = await _post(c, model, "sk-a", None, **{"X-Infera-Deadline-Ms": str(deadline_ms)})
        elapsed = time.perf_counter() - t0
        assert r.status_code == 429, r.text
        assert r.json()["error"]["code"] == "deadline_unreachable"
        assert int(r.headers["retry-after"]) >= 1
        assert elapsed < deadline_ms / 1000.0
        bad = await _post(c, model, "sk-a", None, **{"X-Infera-Deadline-Ms": "soon"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "x-infera-deadline-ms"
        assert all(x.status_code == 200 for x in await asyncio.gather(*flood))
        text = (await c.get("/metrics")).text
        assert metric_sum(text, "infera_queue_shed_total", reason="deadline") >= 1


def test_a_full_queue_sheds_its_newest_sheddable_waiter_for_a_critical_request(
    sims: list[SimHandle], tmp_path: Path
) -> None:
    model = sims[0].info["model"]

    async def scenario(url: str) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            bulk = [asyncio.ensure_future(_post(c, model, "sk-bulk")) for _ in range(6)]
            await _until_queued(c, 4)  # 2 running, 4 waiting: the queue is full
            refused = await _post(c, model, "sk-bulk")
            assert refused.status_code == 429 and refused.json()["error"]["code"] == "queue_full"
            vip = await _post(c, model, "sk-vip")
            assert vip.status_code == 200, vip.text
            codes = [r.status_code for r in await asyncio.gather(*bulk)]
            assert sorted(codes) == [200] * 5 + [503], codes
            shed = next(r for r in await asyncio.gather(*bulk) if r.status_code == 503)
            assert shed.json()["error"]["code"] == "request_shed" and shed.headers["retry-after"]
            text = (await c.get("/metrics")).text
            assert metric_sum(text, "infera_queue_shed_total", tier="sheddable", reason="priority") == 1

    with _serve(sims, tmp_path, "--queue-max", "4") as s:
        poll(lambda: s.http.get("/health").status_code == 200)
        asyncio.run(scenario(s.url))


def test_two_server_processes_queue_on_the_shared_cap(sims: list[SimHandle], tmp_path: Path) -> None:
    """``serve --processes 2``: the cap is the router's (shared counts); a slot freed by the other
    process is found by the queue's re-check, so every request is still served."""
    model = sims[0].info["model"]

    async def burst(url: str) -> list[int]:
        limits = httpx.Limits(max_keepalive_connections=0)  # a connection each: both processes get some
        async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as c:
            return [
                r.status_code for r in await asyncio.gather(*(_post(c, model, "sk-a") for _ in range(12)))
            ]

    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump(KEYS))
    workers = [{"worker_id": f"s{i}", "url": s.url, "model": s.info["model"]} for i, s in enumerate(sims)]
    flags = ("--router-policy", "round-robin", "--max-inflight-per-worker", "1", "--api-key-file", str(keys))
    with serve_processes(workers, tmp_path, *flags, processes=2) as s:
        assert asyncio.run(burst(s.url)) == [200] * 12
