"""Fault injection flags, as a router's reliability tests see them."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from infera_sim.adapter import SimAdapter
from infera_sim.testing import start_sim

from infera_core.engines.base import RunningEngine
from infera_core.testing.contracts import sample_launch_context

BODY = {"prompt": "hello", "max_tokens": 2}


def test_error_rate_and_slow_start() -> None:
    with (
        start_sim(
            speedup="inf",
            fault_error_rate=0.5,
            fault_error_status=429,
            fault_slow_start=1.5,
            wait_healthy=False,
        ) as sim,
        httpx.Client(timeout=5) as client,
    ):
        deadline = time.monotonic() + 20
        while True:
            try:
                first = client.get(sim.url + "/health").status_code
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.02)
        assert first == 503
        while client.get(sim.url + "/health").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        statuses = [client.post(sim.url + "/v1/completions", json=BODY).status_code for _ in range(40)]
        failed = client.post(sim.url + "/v1/completions", json=BODY)
        while failed.status_code == 200:
            failed = client.post(sim.url + "/v1/completions", json=BODY)
    assert set(statuses) == {200, 429}
    assert 5 <= statuses.count(429) <= 35
    assert failed.json()["error"]["code"] == 429


def test_crash_after_n_requests() -> None:
    with start_sim(speedup="inf", fault_crash_after=2) as sim, httpx.Client(timeout=5) as client:
        assert client.post(sim.url + "/v1/completions", json=BODY).status_code == 200
        assert client.post(sim.url + "/v1/completions", json=BODY).status_code == 200
        with pytest.raises(httpx.TransportError):
            client.post(sim.url + "/v1/completions", json=BODY)
        assert sim.proc.wait(5) == 17


async def test_hang_accepts_and_never_answers() -> None:
    adapter = SimAdapter()
    with start_sim(speedup="inf", fault_hang=True) as sim:
        async with httpx.AsyncClient() as client:
            with pytest.raises(httpx.ReadTimeout):
                await client.post(sim.url + "/v1/completions", json=BODY, timeout=0.5)
            hung = asyncio.create_task(client.post(sim.url + "/v1/completions", json=BODY, timeout=30))
            await asyncio.sleep(0.3)
            engine = RunningEngine(sample_launch_context(), client, sim.url)
            assert await adapter.in_flight(engine) == 1  # a drain would wait for it
            assert await adapter.is_ready(engine)
            hung.cancel()
        assert sim.proc.poll() is None
