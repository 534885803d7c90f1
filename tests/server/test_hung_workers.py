"""A worker that accepts requests and never answers leaves rotation; a slow one does not.

The hung worker's ``/health`` would still say OK: only its silence gives it away. The
router compares each worker's wait for response headers with its peers (first-byte
outlier detection) and opens the hung worker's breaker; requests already waiting on it
are retried on another worker, so clients see a 200, a little late, and nothing is lost.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from infera_core.scheduling.types import Endpoint
from infera_core.server.breaker import Breakers
from infera_core.server.hangs import HangDetector
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import RunningServer, serving, settings_for, until
from infera_core.testing.upstream import FakeUpstream, fake_upstreams, record_for
from infera_core.worker import WorkerRecord

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}


@asynccontextmanager
async def fleet(n: int, **settings: Any) -> AsyncIterator[tuple[RunningServer, list[FakeUpstream]]]:
    async with fake_upstreams(n) as ups, serving(settings_for(**settings), make_hooks()) as srv:
        for u in ups:
            srv.store.put(record_for(u))
        await srv.wait_workers(n)
        yield srv, ups


async def breakers(c: httpx.AsyncClient) -> dict[str, str]:
    return {w["worker_id"]: w["breaker"] for w in (await c.get("/v1/workers")).json()["data"]}


async def traffic(c: httpx.AsyncClient, clients: int, until_true: Any, within: float) -> list[int]:
    """``clients`` loops posting chats until ``until_true()``; every status code seen."""
    codes: list[int] = []
    deadline = time.monotonic() + within

    async def loop() -> None:
        while not until_true() and time.monotonic() < deadline:
            r = await c.post("/v1/chat/completions", json=CHAT)
            codes.append(r.status_code)

    await asyncio.gather(*(loop() for _ in range(clients)))
    return codes


async def test_a_hung_worker_leaves_rotation_and_its_requests_are_retried() -> None:
    async with fleet(3, hang_timeout=0.5) as (srv, ups), httpx.AsyncClient(base_url=srv.url, timeout=20) as c:
        ups[0].hang = True  # w0 accepts and never answers
        ups[1].delay = 0.3  # w1 is slow but answers
        t0 = time.monotonic()
        opened: list[float] = []

        def w0_open() -> bool:
            ep = srv.core.table.by_id["w0"]
            if ep.breaker_open and not opened:
                opened.append(time.monotonic() - t0)
            return bool(opened)

        codes = await traffic(c, 4, w0_open, within=10)
        assert opened and opened[0] < 3.0, "the hung worker stayed in rotation"
        assert set(codes) == {200}  # requests that waited on w0 were retried elsewhere
        more = await traffic(c, 4, lambda: False, within=1.0)
        assert set(more) == {200}
        state = await breakers(c)
        assert state["w0"] in ("open", "half-open") and state["w1"] == "closed" and state["w2"] == "closed"
        metrics = (await c.get("/metrics")).text
        assert any(
            line.startswith("infera_breaker_opened_total") and not line.endswith(" 0.0")
            for line in metrics.splitlines()
        )


async def test_a_fleet_that_is_slow_everywhere_is_left_in_rotation() -> None:
    async with fleet(2, hang_timeout=0.3) as (srv, ups), httpx.AsyncClient(base_url=srv.url, timeout=20) as c:
        for u in ups:
            u.delay = 1.0  # slower than the threshold, but every worker is: no outlier
        codes = await asyncio.gather(*(c.post("/v1/chat/completions", json=CHAT) for _ in range(4)))
        assert [r.status_code for r in codes] == [200] * 4
        assert await breakers(c) == {"w0": "closed", "w1": "closed"}


async def test_a_peer_whose_requests_are_only_younger_is_no_evidence_of_an_outlier() -> None:
    """The slow-everywhere fleet as a loaded router sees it: w1 got its requests 0.2 s after w0.
    At 0.35 s w0 waited past the bar and w1 not yet, but w1 answered nothing either: w0 stays.
    Once w1 answers, w0 (still silent) is the outlier."""
    now = [0.0]
    peers = [
        Endpoint(WorkerRecord(worker_id=f"w{i}", url=f"http://w{i}", model="m", engine="e")) for i in range(2)
    ]
    detector = HangDetector(Breakers(3, 5.0), lambda: peers, timeout=0.3, factor=1.0, clock=lambda: now[0])
    held = asyncio.ensure_future(asyncio.sleep(60))  # the requests' task, cancelled when w0 trips
    detector.begin(peers[0], held)
    now[0] = 0.2
    w1 = detector.begin(peers[1], held)
    now[0] = 0.35
    detector._check()
    assert not peers[0].breaker_open
    now[0] = 0.4
    detector.end(w1, answered=True)
    detector.begin(peers[1], held)  # w1 is busy again, but it answered within the bar
    now[0] = 0.45
    detector._check()
    assert peers[0].breaker_open and not peers[1].breaker_open
    await asyncio.sleep(0)
    assert held.cancelled()


async def test_the_threshold_follows_the_fleets_typical_latency() -> None:
    async with (
        fleet(2, hang_timeout=0.2, hang_factor=4.0) as (srv, ups),
        httpx.AsyncClient(base_url=srv.url, timeout=20) as c,
    ):
        for u in ups:
            u.delay = 0.15
        for _ in range(4):
            assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200
        hangs = srv.core.hangs
        assert hangs is not None and hangs.threshold >= 0.5  # 4 × ~0.15 s beats the 0.2 s floor
        ups[0].delay = 0.35  # slower than the floor, well within the learned threshold
        codes = await asyncio.gather(*(c.post("/v1/chat/completions", json=CHAT) for _ in range(4)))
        assert [r.status_code for r in codes] == [200] * 4
        assert (await breakers(c))["w0"] == "closed"


async def test_hang_detection_can_be_turned_off() -> None:
    async with (
        fleet(2, hang_timeout=0, first_byte_timeout=0.8) as (srv, ups),
        httpx.AsyncClient(base_url=srv.url, timeout=20) as c,
    ):
        ups[0].hang = True
        assert srv.core.hangs is not None and srv.core.hangs.begin(srv.core.table.by_id["w0"]) is None
        codes = [(await c.post("/v1/chat/completions", json=CHAT)).status_code for _ in range(2)]
        assert codes == [200, 200]  # the first-byte timeout still retries elsewhere


@pytest.mark.slow
async def test_a_hung_sim_is_out_within_30s_by_default_and_a_slow_sim_is_not() -> None:
    from infera_sim.testing import start_sim

    model = "sim-model"
    quiet: dict[str, Any] = {"kv_events_port": None, "kv_replay_port": None, "model": model}
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
    with (
        start_sim(speedup="inf", **quiet) as fast,
        start_sim(itl_base_ms=300.0, prefill_tokens_per_s=200.0, **quiet) as slow,  # ~2.5 s a request
        start_sim(fault_hang=True, **quiet) as hung,
    ):
        async with serving(settings_for(first_byte_timeout=600.0), make_hooks()) as srv:
            for name, sim in (("fast", fast), ("slow", slow), ("hung", hung)):
                srv.store.put(WorkerRecord(worker_id=name, url=sim.url, model=model, engine="sim"))
            await srv.wait_workers(3)
            assert srv.core.hangs is not None and srv.core.hangs.timeout == 20.0  # the default
            async with httpx.AsyncClient(base_url=srv.url, timeout=120) as c:
                assert (await c.get(hung.url + "/health")).status_code == 200  # it looks healthy
                t0 = time.monotonic()
                codes: list[int] = []

                async def client() -> None:
                    while not srv.core.table.by_id["hung"].breaker_open and time.monotonic() - t0 < 40:
                        codes.append((await c.post("/v1/chat/completions", json=body)).status_code)

                await asyncio.gather(*(client() for _ in range(3)))
                elapsed = time.monotonic() - t0
                assert srv.core.table.by_id["hung"].breaker_open and elapsed < 30, elapsed
                await until(lambda: all(ep.in_flight == 0 for ep in srv.core.table.by_id.values()), 60)
                assert set(codes) == {200}
                assert not srv.core.table.by_id["slow"].breaker_open
                assert not srv.core.table.by_id["fast"].breaker_open


async def test_a_long_non_streaming_request_on_a_busy_worker_runs_once() -> None:
    """Issue #28 row 9: a legit non-streaming request that takes twice the hang timeout on a
    quiet 2-worker fleet (its headers come only when it is done). The silent worker's
    engine counters move, so it is not hung: the request runs once, on one worker, and no
    breaker opens. (Before: ejected at the timeout, the request rerun on the other one.)"""
    from infera_sim.testing import start_sim

    model = "sim-model"
    slow: dict[str, Any] = {
        "kv_events_port": None,
        "kv_replay_port": None,
        "model": model,
        "itl_base_ms": 100.0,
    }
    body = {"model": model, "prompt": "hello there", "max_tokens": 45, "ignore_eos": True}  # ~4.5 s
    with start_sim(**slow) as a, start_sim(**slow) as b:
        async with serving(settings_for(hang_timeout=2.0), make_hooks()) as srv:
            for name, sim in (("a", a), ("b", b)):
                srv.store.put(WorkerRecord(worker_id=name, url=sim.url, model=model, engine="sim"))
            await srv.wait_workers(2)
            async with httpx.AsyncClient(timeout=60) as c:
                r = await c.post(srv.url + "/v1/completions", json=body)
                assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 45
                generated = 0.0
                for sim in (a, b):
                    text = (await c.get(sim.url + "/metrics")).text
                    generated += sum(
                        float(line.split()[-1])
                        for line in text.splitlines()
                        if line.startswith("vllm:generation_tokens_total")
                    )
            assert generated == 45  # run once: not rerun on the other worker
            assert not any(ep.breaker_open for ep in srv.core.table.by_id.values())
            assert srv.core.breakers.opened == 0


def test_up_hands_hang_detection_and_pool_timeout_to_its_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """``infera-run up`` takes --hang-timeout, --hang-factor and --pool-timeout (flag, env,
    config key) like ``serve`` and gives them to its embedded server."""
    from infera_core.up.settings import UpSettings
    from infera_core.up.stack import Stack

    monkeypatch.setenv("INFERA_HANG_TIMEOUT", "7.5")
    settings = UpSettings(workers=0, hang_factor=2.0, pool_timeout=3.0)
    served = Stack(settings, make_hooks())._serve_settings()
    assert (served.hang_timeout, served.hang_factor, served.pool_timeout) == (7.5, 2.0, 3.0)
