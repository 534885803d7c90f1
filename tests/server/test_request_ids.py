"""Request ids are the router's: a client's X-Request-Id is a label, echoed back, never a key."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator

import httpx
import pytest
from aiohttp import web

from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import serving, settings_for
from infera_core.util.net import free_port
from infera_core.worker import WorkerRecord

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


class RecordingEngine:
    """Answers chat completions once ``expect`` requests are in flight together; records ids."""

    def __init__(self, expect: int) -> None:
        self.ids: list[str] = []
        self.expect = expect
        self.all_in = asyncio.Event()

    async def chat(self, request: web.Request) -> web.Response:
        self.ids.append(request.headers.get("X-Request-Id", ""))
        if len(self.ids) >= self.expect:
            self.all_in.set()
        await asyncio.wait_for(self.all_in.wait(), 10)
        body = {"id": "x", "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}
        return web.json_response(body)


@pytest.fixture
async def engine() -> AsyncIterator[tuple[RecordingEngine, str]]:
    eng = RecordingEngine(expect=2)
    app = web.Application()
    app.router.add_post("/v1/chat/completions", eng.chat)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield eng, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_two_clients_with_one_request_id_both_succeed_under_distinct_ids(
    engine: tuple[RecordingEngine, str],
) -> None:
    eng, url = engine
    async with serving(settings_for(), make_hooks()) as srv:
        srv.store.put(WorkerRecord(worker_id="w", url=url, model="m", engine="fake"))
        await srv.wait_workers(1)
        async with (
            httpx.AsyncClient(base_url=srv.url, timeout=15) as a,
            httpx.AsyncClient(base_url=srv.url, timeout=15) as b,
        ):
            ra, rb = await asyncio.gather(
                a.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": "same-id"}),
                b.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": "same-id"}),
            )
    assert ra.status_code == rb.status_code == 200
    assert ra.headers["x-request-id"] == rb.headers["x-request-id"] == "same-id"  # echoed back
    assert len(eng.ids) == 2 and len(set(eng.ids)) == 2  # the engine saw two distinct ids…
    assert "same-id" not in eng.ids  # …neither of them the client's


async def test_client_id_labels_log_lines_and_errors_echo_it(caplog: pytest.LogCaptureFixture) -> None:
    dead = free_port()
    async with serving(settings_for(request_max_retries=0), make_hooks()) as srv:
        srv.store.put(WorkerRecord(worker_id="w", url=f"http://127.0.0.1:{dead}", model="m", engine="fake"))
        await srv.wait_workers(1)
        async with httpx.AsyncClient(base_url=srv.url) as c:
            with caplog.at_level(logging.WARNING, logger="infera"):
                r = await c.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": "trace-42"})
                plain = await c.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 502 and r.headers["x-request-id"] == "trace-42"
    assert json.loads(r.text)["error"]["code"] == "upstream_unreachable"
    assert "x-request-id" not in plain.headers  # nothing to echo
    lines = [rec.getMessage() for rec in caplog.records if "trace-42" in rec.getMessage()]
    assert lines and all(line.startswith("request infera-") for line in lines)
