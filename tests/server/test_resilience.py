"""Retries, circuit breakers, admission control, no-worker and draining behaviour, metrics."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from infera_core.testing.server import post_at_once, serving_upstreams, sse_data, until
from infera_core.testing.upstream import FakeUpstream, fake_upstreams, record_for
from infera_core.worker import Status

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}


async def _metric(c: httpx.AsyncClient, prefix: str) -> float:
    text = (await c.get("/metrics")).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


async def test_dead_worker_requests_are_retried_elsewhere(ups: list[FakeUpstream]) -> None:
    async with serving_upstreams(ups) as srv, httpx.AsyncClient(base_url=srv.url) as c:
        await ups[0].stop()  # still registered, but nothing listens any more
        results = [await c.post("/v1/chat/completions", json=CHAT) for _ in range(6)]
        assert [r.status_code for r in results] == [200] * 6
        assert {r.json()["worker"] for r in results} == {"w1"}
        assert await _metric(c, "infera_retries_total") >= 1


@pytest.mark.parametrize("client", ["native", "aiohttp"])
async def test_workers_refusing_the_connection_are_passed_over_without_using_a_retry(client: str) -> None:
    """Two workers just gone (their records outlive them until their leases end): with one retry,
    every request still reaches the live worker, since nothing was sent to the dead ones; when
    every worker refuses, the client gets the last refusal as a 502 (not a 500)."""
    if client == "aiohttp":
        pytest.importorskip("aiohttp")
    async with (
        fake_upstreams(3) as ups,
        serving_upstreams(ups, request_max_retries=1, http_client=client) as srv,
        httpx.AsyncClient(base_url=srv.url) as c,
    ):
        await ups[0].stop()
        await ups[1].stop()
        results = [await c.post("/v1/chat/completions", json=CHAT) for _ in range(6)]
        assert [r.status_code for r in results] == [200] * 6, [r.text for r in results]
        assert {r.json()["worker"] for r in results} == {"w2"}
        await ups[2].stop()
        r = await c.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 502, r.text
        assert r.json()["error"]["code"] == "upstream_unreachable"


async def test_5xx_is_retried_and_opens_breaker_then_half_open_probe_closes_it(
    ups: list[FakeUpstream],
) -> None:
    async with (
        serving_upstreams(ups, breaker_failures=2, breaker_cooldown=0.3) as srv,
        httpx.AsyncClient(base_url=srv.url) as c,
    ):
        ups[0].status = 500
        for _ in range(4):
            r = await c.post("/v1/chat/completions", json=CHAT)
            assert r.status_code == 200 and r.json()["worker"] == "w1"
        failed_calls = ups[0].requests
        assert failed_calls == 2  # then the breaker kept requests away
        workers = {w["worker_id"]: w for w in (await c.get("/v1/workers")).json()["data"]}
        assert workers["w0"]["breaker"] == "open"
        assert workers["w1"]["breaker"] == "closed"
        for _ in range(3):
            await c.post("/v1/chat/completions", json=CHAT)
        assert ups[0].requests == failed_calls
        await asyncio.sleep(0.35)
        ups[0].status = 200
        seen = {(await c.post("/v1/chat/completions", json=CHAT)).json()["worker"] for _ in range(4)}
        assert seen == {"w0", "w1"}  # the probe succeeded: w0 is back in rotation
        workers = {w["worker_id"]: w for w in (await c.get("/v1/workers")).json()["data"]}
        assert workers["w0"]["breaker"] == "closed"


async def test_failed_probe_reopens_the_breaker(ups: list[FakeUpstream]) -> None:
    async with (
        serving_upstreams(ups, breaker_failures=1, breaker_cooldown=0.2) as srv,
        httpx.AsyncClient(base_url=srv.url) as c,
    ):
        ups[0].status = 503
        for _ in range(3):
            assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200
        assert ups[0].requests == 1
        await asyncio.sleep(0.25)
        for _ in range(3):
            assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200
        assert ups[0].requests == 2  # exactly one half-open probe, which failed
        workers = {w["worker_id"]: w for w in (await c.get("/v1/workers")).json()["data"]}
        assert workers["w0"]["breaker"] == "open"


async def test_client_errors_pass_through_and_never_open_the_breaker(ups: list[FakeUpstream]) -> None:
    async with (
        serving_upstreams(ups[:1], breaker_failures=1) as srv,
        httpx.AsyncClient(base_url=srv.url) as c,
    ):
        ups[0].status = 400
        for _ in range(3):
            r = await c.post("/v1/chat/completions", json=CHAT)
            assert r.status_code == 400
        assert ups[0].requests == 3
        workers = (await c.get("/v1/workers")).json()["data"]
        assert workers[0]["breaker"] == "closed"


async def test_all_workers_failing_returns_last_error_not_500(ups: list[FakeUpstream]) -> None:
    async with serving_upstreams(ups, request_max_retries=1) as srv, httpx.AsyncClient(base_url=srv.url) as c:
        for u in ups:
            u.status = 503
        r = await c.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 503
        assert "answered 503" in r.json()["error"]["message"]
        assert sum(u.requests for u in ups) == 2


async def test_admission_cap_answers_429_with_retry_after(ups: list[FakeUpstream]) -> None:
    async with (
        serving_upstreams(ups, max_inflight_per_worker=1, queue_max=0) as srv,
        httpx.AsyncClient(base_url=srv.url) as c,
    ):
        for u in ups:
            u.delay = 0.5
        results = await post_at_once(c, "/v1/chat/completions", CHAT, 3)
        assert [r.status_code for r in results] == [200, 200, 429]
        limited = results[-1]
        assert limited.headers["retry-after"] == "1"
        assert limited.json()["error"]["type"] == "rate_limit_error"


async def test_no_workers_is_503_and_health_reports_it(ups: list[FakeUpstream]) -> None:
    async with serving_upstreams([]) as srv, httpx.AsyncClient(base_url=srv.url) as c:
        r = await c.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 503
        assert r.json()["error"]["code"] == "no_worker_available"
        h = await c.get("/health")
        assert h.status_code == 503 and h.json()["active_workers"] == 0
        srv.store.put(record_for(ups[0]))
        await srv.wait_workers(1)
        h = await c.get("/health")
        assert h.status_code == 200 and h.json()["active_workers"] == 1
        assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200


async def test_draining_worker_gets_no_new_requests(ups: list[FakeUpstream]) -> None:
    async with serving_upstreams(ups) as srv, httpx.AsyncClient(base_url=srv.url) as c:
        srv.store.put(record_for(ups[0], status=Status.DRAINING))
        await until(lambda: srv.core.table.by_id["w0"].record.status is Status.DRAINING)
        workers = {(await c.post("/v1/chat/completions", json=CHAT)).json()["worker"] for _ in range(4)}
        assert workers == {"w1"}
        srv.store.put(record_for(ups[1], status=Status.DRAINING))
        await asyncio.sleep(0.05)
        r = await c.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 503 and "fake-model" in r.json()["error"]["message"]


async def test_multi_model_routes_only_to_workers_of_the_model() -> None:
    a, b = FakeUpstream("a", model="alpha"), FakeUpstream("b", model="beta")
    await a.start()
    await b.start()
    try:
        async with serving_upstreams([a, b]) as srv, httpx.AsyncClient(base_url=srv.url) as c:
            for model, worker in [("alpha", "a"), ("beta", "b")] * 3:
                r = await c.post("/v1/chat/completions", json={**CHAT, "model": model})
                assert r.json()["worker"] == worker
            ids = [m["id"] for m in (await c.get("/v1/models")).json()["data"]]
            assert ids == ["alpha", "beta"]
            r = await c.post("/v1/chat/completions", json={**CHAT, "model": "gamma"})
            assert r.status_code == 404
            assert "alpha, beta" in r.json()["error"]["message"]
    finally:
        await a.stop()
        await b.stop()


async def test_direct_mode_honours_worker_header_and_falls_back(ups: list[FakeUpstream]) -> None:
    async with serving_upstreams(ups, router_mode="direct") as srv, httpx.AsyncClient(base_url=srv.url) as c:
        for _ in range(3):
            r = await c.post("/v1/chat/completions", json=CHAT, headers={"x-worker-instance-id": "w1"})
            assert r.json()["worker"] == "w1"
        workers = {
            (
                await c.post("/v1/chat/completions", json=CHAT, headers={"x-worker-instance-id": "gone"})
            ).json()["worker"]
            for _ in range(4)
        }
        assert workers == {"w0", "w1"}


async def test_metrics_cover_requests_streams_tokens_and_routing(ups: list[FakeUpstream]) -> None:
    async with serving_upstreams(ups) as srv, httpx.AsyncClient(base_url=srv.url) as c:
        for _ in range(2):
            await c.post("/v1/chat/completions", json=CHAT)
        await c.post("/v1/chat/completions", json={**CHAT, "stream": True})
        await c.post("/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user"}]})
        text = (await c.get("/metrics")).text
    assert 'infera_requests_total{model="fake-model",route="/v1/chat/completions",status="200"} 3.0' in text
    assert 'infera_requests_total{model="-",route="/v1/chat/completions",status="404"} 1.0' in text
    assert 'infera_time_to_first_token_seconds_count{model="fake-model"} 1.0' in text
    assert 'infera_inter_token_latency_seconds_count{model="fake-model"} 1.0' in text
    assert 'infera_tokens_total{kind="prompt",model="fake-model"} 10.0' in text
    assert 'infera_routing_decision_seconds_count{policy="round-robin"} 3.0' in text
    assert 'infera_worker_picks_total{model="fake-model",worker="w0"}' in text
    assert 'infera_worker_in_flight{worker="w1"} 0.0' in text
    assert 'infera_worker_breaker_state{worker="w0"} 0.0' in text


async def test_first_byte_timeout_retries_then_504(ups: list[FakeUpstream]) -> None:
    async with (
        serving_upstreams(ups, first_byte_timeout=0.3) as srv,
        httpx.AsyncClient(base_url=srv.url, timeout=10) as c,
    ):
        ups[0].delay = 5.0
        r = await c.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 200 and r.json()["worker"] == "w1"  # w0 timed out, retried on w1
        ups[1].delay = 5.0
        r = await c.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 504 and r.json()["error"]["code"] == "upstream_timeout"


async def test_idle_stream_timeout_ends_the_stream_with_an_error_event(ups: list[FakeUpstream]) -> None:
    async with (
        serving_upstreams(ups, stream_idle_timeout=0.3) as srv,
        httpx.AsyncClient(base_url=srv.url, timeout=10) as c,
    ):
        for u in ups:
            u.chunk_delay = 2.0
        lines = await sse_data(c, "/v1/chat/completions", {**CHAT, "stream": True})
        assert len(lines) == 1 and '"error"' in lines[0]
