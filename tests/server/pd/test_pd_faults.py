"""PD failures with real sim processes: prefill 500s, decode 500s, client disconnect, decode killed mid-stream."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from infera_core.testing.fixtures import make_hooks
from infera_core.testing.pd import SimPdFleet, sim_pd_fleet
from infera_core.testing.pd import metric_sum as metric
from infera_core.testing.server import RunningServer, serving, settings_for, until

pytestmark = pytest.mark.slow

PROTOCOLS = ["vllm-nixl", "sglang-bootstrap"]
FAULT = {"fault_error_rate": 1}


def prompt() -> str:
    tag = uuid.uuid4().hex[:8]
    return " ".join(f"{tag}w{i}" for i in range(120))


@pytest.fixture(scope="module", params=PROTOCOLS)
def bad_prefill(request: pytest.FixtureRequest) -> Iterator[SimPdFleet]:
    """p0 answers every request with 500; d0 runs in real time (long streams)."""
    with sim_pd_fleet(
        request.param, prefill=2, decode=1, per_worker={"p0": FAULT, "d0": {"speedup": 1}}
    ) as f:
        yield f


async def settled(srv: RunningServer) -> None:
    """Every leg released: no request or prompt tokens left counted on any worker."""
    eps = list(srv.core.table.by_id.values())
    await until(lambda: all(ep.in_flight == 0 and ep.in_flight_prompt_tokens == 0 for ep in eps), within=10)


async def _serve(fleet: SimPdFleet, **settings: Any) -> AsyncIterator[RunningServer]:
    async with serving(settings_for(**settings), make_hooks()) as s:
        for record in fleet.records:
            s.store.put(record)
        await s.wait_workers(len(fleet.records))
        yield s


@pytest.fixture
async def srv(bad_prefill: SimPdFleet) -> AsyncIterator[RunningServer]:
    async for s in _serve(bad_prefill, breaker_failures=2, breaker_cooldown=60):
        yield s


async def test_prefill_500_is_retried_on_another_pair_and_trips_its_breaker(srv: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=srv.url, timeout=20) as c:
        for i in range(6):
            body = {"model": "sim-model", "prompt": prompt(), "max_tokens": 3, "stream": i % 2 == 1}
            r = await c.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            assert "error" not in r.text
        text = (await c.get("/metrics")).text
        failures = metric(text, "infera_pd_failures_total", reason="prefill_error")
        assert failures == 2  # then p0's breaker kept it out of pairs
        assert metric(text, "infera_pd_pairs_total", prefill="p1") == 6
        workers = {w["worker_id"]: w for w in (await c.get("/v1/workers")).json()["data"]}
        assert workers["p0"]["breaker"] == "open" and workers["p1"]["breaker"] == "closed"
    await settled(srv)


async def _held(c: httpx.AsyncClient, fleet: SimPdFleet, worker: str) -> float:
    """Requests ``worker``'s engine holds: running, or waiting (e.g. for its KV transfer)."""
    text = (await c.get(fleet.by_id(worker).handle.url + "/metrics")).text
    return metric(text, "vllm:num_requests_running") + metric(text, "vllm:num_requests_waiting")


async def _until_held(
    c: httpx.AsyncClient, fleet: SimPdFleet, worker: str, n: int, within: float = 15, why: str = ""
) -> None:
    """Poll ``worker``'s gauges (another process: no event to wait on) until it holds ``n`` requests."""
    try:
        async with asyncio.timeout(within):
            while await _held(c, fleet, worker) != n:  # noqa: ASYNC110 (polling another process)
                await asyncio.sleep(0.05)
    except TimeoutError:
        held = await _held(c, fleet, worker)
        raise AssertionError(f"{worker} holds {held} requests, not {n}, after {within} s; {why}") from None


async def test_client_disconnect_cancels_the_decode_leg(srv: RunningServer, bad_prefill: SimPdFleet) -> None:
    body = {"model": "sim-model", "prompt": prompt(), "max_tokens": 2000, "stream": True}
    async with httpx.AsyncClient(timeout=20) as c:
        async with c.stream("POST", srv.url + "/v1/completions", json=body) as r:
            assert r.status_code == 200
            first = ""
            # hold the line iterator: a dropped one is closed by the loop (asyncgen finalizer),
            # which closes the stream, i.e. the client leaves before the check below
            lines = r.aiter_lines()
            async for line in lines:
                if line.startswith("data: "):
                    first = line
                    break
            assert '"error"' not in first, first
            # the first chunk can reach the client before d0's gauges count it: wait for that
            await _until_held(c, bad_prefill, "d0", 1, why=f"first chunk: {first[:300]}")
        # the client went away: the router cancels the decode leg, the engine stops the request
        await _until_held(c, bad_prefill, "d0", 0)
    await settled(srv)


async def test_decode_killed_mid_stream_ends_the_stream_with_an_error_event(
    srv: RunningServer, bad_prefill: SimPdFleet
) -> None:
    body = {"model": "sim-model", "prompt": prompt(), "max_tokens": 2000, "stream": True}
    lines: list[str] = []
    async with httpx.AsyncClient(base_url=srv.url, timeout=20) as c:
        async with asyncio.timeout(15), c.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                lines.append(line)
                if len(lines) == 3:
                    bad_prefill.by_id("d0").handle.proc.kill()
        assert len(lines) > 3
        assert '"error"' in lines[-1] and "d0" in lines[-1]
        assert "[DONE]" not in lines[-1]
        text = (await c.get("/metrics")).text
        assert metric(text, "infera_pd_failures_total", reason="decode_incomplete") >= 1


# -- decode failing before its first byte -------------------------------------------------------


@pytest.fixture(scope="module", params=PROTOCOLS)
def bad_decode(request: pytest.FixtureRequest) -> Iterator[SimPdFleet]:
    """d0 answers every request with 500 (serial pull gets a second decode worker d1)."""
    decode = 2 if request.param == "vllm-nixl" else 1
    with sim_pd_fleet(request.param, prefill=1, decode=decode, per_worker={"d0": FAULT}) as f:
        yield f


async def test_decode_500_before_first_byte(bad_decode: SimPdFleet) -> None:
    serial = len(bad_decode.records) == 3
    async for s in _serve(bad_decode, breaker_failures=100):
        async with httpx.AsyncClient(base_url=s.url, timeout=20) as c:
            results = []
            for _ in range(4):
                body = {"model": "sim-model", "prompt": prompt(), "max_tokens": 3}
                results.append(await c.post("/v1/completions", json=body))
            text = (await c.get("/metrics")).text
        assert metric(text, "infera_pd_failures_total", reason="decode_error") >= 1
        if serial:  # vllm-nixl: the KV waits on the prefill, another decode worker pulls it
            assert [r.status_code for r in results] == [200] * 4
            assert {r.headers["x-infera-worker"] for r in results} == {"d1"}
            assert metric(text, "infera_retries_total") >= 1
        else:  # sglang-bootstrap: the KV went to d0; a clear 502, never a hang
            assert {r.status_code for r in results} == {502}
            err = results[0].json()["error"]
            assert "Decode worker d0 answered 500" in err["message"]
            assert "not retried elsewhere" in err["message"]
        await settled(s)


# -- a leg's worker that accepts and never answers (sim --fault-hang) ---------------------------


async def _traffic_until(c: httpx.AsyncClient, ep: Any, within: float, clients: int = 4) -> list[int]:
    """``clients`` loops of completions (every other one streamed) until ``ep``'s breaker opens; the statuses."""
    codes: list[int] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within

    async def client(i: int) -> None:
        while not ep.breaker_open and loop.time() < deadline:
            body = {"model": "sim-model", "prompt": prompt(), "max_tokens": 3, "stream": i % 2 == 1}
            codes.append((await c.post("/v1/completions", json=body)).status_code)

    await asyncio.gather(*(client(i) for i in range(clients)))
    return codes


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("side", ["prefill", "decode"])
async def test_a_hung_pd_worker_leaves_rotation(protocol: str, side: str) -> None:
    """p0 (or d0) accepts its legs and never answers while its /health says OK: first-byte
    outlier detection opens its breaker within a few hang timeouts and the requests go on."""
    hung = "p0" if side == "prefill" else "d0"
    with sim_pd_fleet(protocol, prefill=2, decode=2, per_worker={hung: {"fault_hang": True}}) as fleet:
        async for s in _serve(fleet, hang_timeout=1.0, breaker_cooldown=60, first_byte_timeout=600):
            async with httpx.AsyncClient(base_url=s.url, timeout=60) as c:
                assert (await c.get(fleet.by_id(hung).handle.url + "/health")).status_code == 200
                ep = s.core.table.by_id[hung]
                codes = await _traffic_until(c, ep, within=30)
                assert ep.breaker_open, f"{hung} still in rotation after 30 s"
                after = []
                for _ in range(4):
                    body = {"model": "sim-model", "prompt": prompt(), "max_tokens": 3}
                    r = await c.post("/v1/completions", json=body)
                    after.append(r.status_code)
                text = (await c.get("/metrics")).text
            assert after == [200] * 4  # out of rotation: nothing is sent to it any more
            # a hung prefill moves to another pair, a hung serial-pull decode to another decode
            # worker: the clients never notice; a push decode got the KV, so its request is a 502
            allowed = {200, 502} if (side, protocol) == ("decode", "sglang-bootstrap") else {200}
            assert set(codes) <= allowed, codes
            assert metric(text, "infera_pd_failures_total", reason=f"{side}_hung") >= 1
            assert not s.core.table.by_id["p1"].breaker_open and not s.core.table.by_id["d1"].breaker_open
            await settled(s)
