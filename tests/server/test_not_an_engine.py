"""A worker record pointing at an HTTP service that is not an engine (issue #28 row 12): its
404s count as the worker's failures (the breaker opens, requests go to the real engine),
while an engine's own 404 (an unknown model) is passed to the client as it came."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from infera_core.engines.base import RunningEngine
from infera_core.launcher.health import default_health_generate, serves_inference
from infera_core.testing.contracts import sample_launch_context
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import serving, settings_for
from infera_core.testing.upstream import ScriptedUpstream, fake_upstreams, http_reply, record_for
from infera_core.worker import WorkerRecord

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}


NOT_FOUND_PAGES = {
    "fastapi": http_reply(404, b'{"detail":"Not Found"}'),
    "html": http_reply(404, b"<html><body><h1>404 Not Found</h1></body></html>", b"text/html"),
    "text": http_reply(404, b"404 page not found\n", b"text/plain"),
}
VLLM_UNKNOWN_MODEL = (
    b'{"error":{"message":"The model `fake-model` does not exist.","type":"NotFoundError",'
    b'"param":"model","code":404}}'
)


@pytest.mark.parametrize("page", sorted(NOT_FOUND_PAGES))
async def test_a_service_answering_404_leaves_rotation_and_every_request_is_served(page: str) -> None:
    async with (
        fake_upstreams(1) as [engine],
        ScriptedUpstream(lambda conn, req: NOT_FOUND_PAGES[page]) as web,
        serving(settings_for(breaker_cooldown=300.0), make_hooks()) as srv,
        httpx.AsyncClient(base_url=srv.url) as c,
    ):
        srv.store.put(record_for(engine))
        srv.store.put(WorkerRecord(worker_id="not-engine", url=web.url, model="fake-model", engine="vllm"))
        await srv.wait_workers(2)
        for _ in range(12):
            r = await c.post("/v1/chat/completions", json=CHAT)
            assert r.status_code == 200, r.text
        workers = {w["worker_id"]: w for w in (await c.get("/v1/workers")).json()["data"]}
        assert workers["not-engine"]["breaker"] == "open"
        assert web.requests == 3  # --breaker-failures, then out of rotation


async def test_alone_it_is_a_502_that_says_so() -> None:
    async with (
        ScriptedUpstream(lambda conn, req: NOT_FOUND_PAGES["fastapi"]) as web,
        serving(settings_for(request_max_retries=0), make_hooks()) as srv,
        httpx.AsyncClient(base_url=srv.url) as c,
    ):
        srv.store.put(WorkerRecord(worker_id="not-engine", url=web.url, model="fake-model", engine="vllm"))
        await srv.wait_workers(1)
        r = await c.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 502
        assert r.json()["error"]["code"] == "upstream_not_an_engine"
        assert "not-engine" in r.json()["error"]["message"]


async def test_an_engines_own_404_is_the_clients_answer() -> None:
    async with (
        ScriptedUpstream(lambda conn, req: http_reply(404, VLLM_UNKNOWN_MODEL)) as engine,
        serving(settings_for(), make_hooks()) as srv,
        httpx.AsyncClient(base_url=srv.url) as c,
    ):
        srv.store.put(WorkerRecord(worker_id="w0", url=engine.url, model="fake-model", engine="vllm"))
        await srv.wait_workers(1)
        for _ in range(5):
            r = await c.post("/v1/chat/completions", json=CHAT)
            assert r.status_code == 404 and r.content == VLLM_UNKNOWN_MODEL
        assert engine.requests == 5  # never retried elsewhere, never counted against the worker
        [w] = (await c.get("/v1/workers")).json()["data"]
        assert w["breaker"] == "closed"


async def _generation_check(answer: bytes) -> bool:
    async with ScriptedUpstream(lambda conn, req: answer) as srv, httpx.AsyncClient(timeout=5) as client:
        ctx: Any = sample_launch_context()
        return await default_health_generate(RunningEngine(ctx, client, srv.url))


@pytest.mark.parametrize("page", sorted(NOT_FOUND_PAGES))
async def test_the_launchers_generation_check_fails_on_a_service_that_is_not_an_engine(page: str) -> None:
    assert await _generation_check(NOT_FOUND_PAGES[page]) is False
    assert await _generation_check(http_reply(405, b'{"detail":"Method Not Allowed"}')) is False
    # an engine that answers, even with its own error, is alive
    assert await _generation_check(http_reply(404, VLLM_UNKNOWN_MODEL)) is True
    assert (
        await _generation_check(http_reply(400, b'{"error":{"message":"bad","type":"x","code":400}}')) is True
    )


async def _serves(answer: bytes) -> bool:
    async with ScriptedUpstream(lambda conn, req: answer) as srv, httpx.AsyncClient(timeout=5) as client:
        ctx: Any = sample_launch_context()
        return await serves_inference(RunningEngine(ctx, client, srv.url), [])


async def test_launcher_readiness_checks_the_inference_api_not_just_health() -> None:
    for page in NOT_FOUND_PAGES.values():
        assert await _serves(page) is False
    assert await _serves(http_reply(405, b'{"detail":"Method Not Allowed"}')) is False
    assert await _serves(http_reply(501, b"Unsupported method", b"text/html")) is False
    # engines refuse the empty body with their own validation error: the API is there
    assert (
        await _serves(http_reply(400, b'{"error":{"message":"prompt missing","type":"x","code":400}}'))
        is True
    )
    assert await _serves(http_reply(422, b'{"detail":[{"msg":"field required"}]}')) is True
    assert await _serves(http_reply(404, VLLM_UNKNOWN_MODEL)) is True


async def test_the_sims_api_passes_the_readiness_check() -> None:
    from infera_sim.testing import start_sim

    with start_sim(model="fake-model", speedup="inf") as sim:
        async with httpx.AsyncClient(timeout=10) as client:
            ctx: Any = sample_launch_context()
            assert await serves_inference(RunningEngine(ctx, client, sim.url), []) is True
