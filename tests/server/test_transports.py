"""The router end to end with each ``--http-client``: same behaviour from both."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest
import uvicorn

from infera_core.discovery.memory import MemoryDiscovery, MemoryStore
from infera_core.server.app import create_app
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import (
    RunningServer,
    leave_mid_stream,
    serving_upstreams,
    settings_for,
    sse_data,
    until,
)
from infera_core.testing.upstream import FakeUpstream, ScriptedUpstream, record_for
from infera_core.worker import WorkerRecord

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(params=["native", "aiohttp"])
def transport(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def srv(transport: str, ups: list[FakeUpstream]) -> AsyncIterator[RunningServer]:
    async with serving_upstreams(ups, http_client=transport) as s:
        yield s


def _idle(srv: RunningServer) -> bool:
    return not sum(ep.in_flight for ep in srv.core.table.by_id.values())


def _released(srv: RunningServer, ups: list[FakeUpstream]) -> bool:
    """The router holds no request and no upstream connection is left open."""
    return _idle(srv) and not any(u.connections for u in ups)


async def test_json_and_stream_pass_through(srv: RunningServer, ups: list[FakeUpstream]) -> None:
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as c:
        for _ in range(4):
            r = await c.post("/v1/chat/completions", json=CHAT)
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "hi"
        lines = await sse_data(c, "/v1/chat/completions", {**CHAT, "stream": True})
    assert len(lines) == 65 and lines[-1] == "data: [DONE]"
    assert [len(u.connections) for u in ups] == [1, 1]  # keep-alive: one connection per worker
    assert _idle(srv)


async def test_a_worker_dying_before_the_first_byte_is_retried_elsewhere(
    srv: RunningServer, ups: list[FakeUpstream]
) -> None:
    async with ScriptedUpstream(lambda conn, req: None) as dying:
        srv.store.put(WorkerRecord(worker_id="dying", url=dying.url, model="fake-model", engine="fake"))
        await srv.wait_workers(3)
        async with httpx.AsyncClient(base_url=srv.url, timeout=10) as c:
            workers = [(await c.post("/v1/chat/completions", json=CHAT)).json()["worker"] for _ in range(6)]
            text = (await c.get("/metrics")).text
    assert dying.requests >= 1  # it was picked, took the request, and closed without a byte
    assert set(workers) <= {"w0", "w1"} and len(workers) == 6
    assert 'infera_retries_total{model="fake-model"}' in text
    assert _idle(srv)


async def test_midstream_death_is_continued_once_then_ends_the_stream_with_an_error(
    srv: RunningServer, ups: list[FakeUpstream]
) -> None:
    for u in ups:
        u.die_after_chunks = 5  # the continuation's worker dies too: --migration-limit 1 is spent
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as c:
        lines = await sse_data(c, "/v1/chat/completions", {**CHAT, "stream": True})
    assert len(lines) == 11  # 5 chunks from each worker, then the error event
    err = json.loads(lines[-1][6:])["error"]
    assert err["code"] == "upstream_stream_error" and "migration limit (1) is spent" in err["message"]
    assert [u.requests for u in ups] == [1, 1]
    await until(lambda: _idle(srv))


async def test_client_disconnect_closes_the_upstream_connection(
    srv: RunningServer, ups: list[FakeUpstream]
) -> None:
    for u in ups:
        u.chunk_delay = 0.05
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as c:
        await leave_mid_stream(c, "/v1/chat/completions", {**CHAT, "stream": True})
        await until(lambda: _released(srv, ups))
        # and the router still serves the next request (a fresh upstream connection)
        for u in ups:
            u.chunk_delay = 0.0
        r = await c.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 200


async def test_client_disconnect_while_waiting_for_the_first_byte(
    srv: RunningServer, ups: list[FakeUpstream]
) -> None:
    for u in ups:
        u.delay = 5.0
    async with httpx.AsyncClient(base_url=srv.url, timeout=0.3) as c:
        with pytest.raises(httpx.ReadTimeout):
            await c.post("/v1/chat/completions", json=CHAT)
    await until(lambda: _released(srv, ups))
    assert sum(u.requests for u in ups) == 1  # cancelled, not retried


async def test_the_idle_timeout_applies_after_the_headers(transport: str, ups: list[FakeUpstream]) -> None:
    for u in ups:
        u.chunk_delay = 2.0
    settings = {"http_client": transport, "stream_idle_timeout": 0.3, "first_byte_timeout": 10}
    async with serving_upstreams(ups, **settings) as s:
        async with httpx.AsyncClient(base_url=s.url, timeout=10) as c:
            lines = await sse_data(c, "/v1/chat/completions", {**CHAT, "stream": True})
        assert len(lines) == 1 and '"error"' in lines[0]
        await asyncio.wait_for(until(lambda: _idle(s)), 5)


async def test_disconnect_cancels_upstream_under_a_plain_uvicorn_protocol(ups: list[FakeUpstream]) -> None:
    """Without Infera's protocol (no disconnect callback in the scope) the endpoint
    watches ``receive()`` itself: a client going away still closes the upstream request."""
    settings = settings_for()
    store = MemoryStore()
    app = create_app(settings, make_hooks(), discovery=MemoryDiscovery(store), start_discovery=True)
    config = uvicorn.Config(
        app, host=settings.host, port=settings.port, http="httptools", loop="none", log_level="error"
    )
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve())
    try:
        await until(lambda: server.started, within=10)
        for u in ups:
            store.put(record_for(u))
            u.chunk_delay = 0.05
        core = app.state.core
        await until(lambda: len(core.table.by_id) == 2)
        url = f"http://{settings.host}:{settings.port}/v1/chat/completions"
        async with httpx.AsyncClient(timeout=10) as c:
            await leave_mid_stream(c, url, {**CHAT, "stream": True})
            await until(
                lambda: (
                    not sum(ep.in_flight for ep in core.table.by_id.values())
                    and not any(u.connections for u in ups)
                )
            )
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
