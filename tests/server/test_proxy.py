"""The pass-through proxy over real HTTP on loopback, in front of fast fake upstreams."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import RunningServer, leave_mid_stream, serving, settings_for, sse_data, until
from infera_core.testing.upstream import FakeUpstream, fake_upstreams, record_for

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
async def ups() -> AsyncIterator[list[FakeUpstream]]:
    async with fake_upstreams(2) as out:
        yield out


async def _serve_with(ups: list[FakeUpstream], **settings: Any) -> Any:
    srv_cm = serving(settings_for(**settings), make_hooks())
    srv = await srv_cm.__aenter__()
    for u in ups:
        srv.store.put(record_for(u))
    await srv.wait_workers(len(ups))
    return srv_cm, srv


@pytest.fixture
async def srv(ups: list[FakeUpstream]) -> AsyncIterator[RunningServer]:
    cm, server = await _serve_with(ups)
    yield server
    await cm.__aexit__(None, None, None)


async def test_body_forwarded_byte_for_byte_and_unknown_fields_kept(
    srv: RunningServer, ups: list[FakeUpstream]
) -> None:
    raw = b'{"model":  "fake-model", "messages":[{"role":"user","content":"h\\u00e9"}], "x_custom": {"k": [1, 2.50]}}'
    async with httpx.AsyncClient(base_url=srv.url) as c:
        r = await c.post("/v1/chat/completions", content=raw)
    assert r.status_code == 200
    assert r.json()["worker"] in {"w0", "w1"}
    got = next(u for u in ups if u.name == r.json()["worker"])
    assert got.last_body == raw
    assert got.last_path == "/v1/chat/completions"


async def test_round_robin_spreads_requests(srv: RunningServer, ups: list[FakeUpstream]) -> None:
    async with httpx.AsyncClient(base_url=srv.url) as c:
        workers = [(await c.post("/v1/chat/completions", json=CHAT)).json()["worker"] for _ in range(6)]
    assert sorted(workers) == ["w0"] * 3 + ["w1"] * 3


async def test_stream_passes_every_chunk_without_nagle_stalls(
    srv: RunningServer, ups: list[FakeUpstream]
) -> None:
    for u in ups:
        u.chunk_delay = 0.002
    body = {**CHAT, "stream": True}

    async def timed(c: httpx.AsyncClient, url: str) -> tuple[list[str], float]:
        t0 = time.perf_counter()
        async with c.stream("POST", url, json=body) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
        return lines, time.perf_counter() - t0

    # 64 chunks stalled by Nagle + delayed ACK would add ≥ 64 × 40 ms ≈ 2.5 s on every try; a
    # busy machine's hiccup slows one try, not three in a row
    tries = []
    async with httpx.AsyncClient(base_url=srv.url) as c:
        for _ in range(3):
            direct, t_direct = await timed(c, ups[0].url + "/v1/chat/completions")
            routed, t_routed = await timed(c, "/v1/chat/completions")
            assert routed == direct
            assert len(routed) == 65 and routed[-1] == "data: [DONE]"
            tries.append((t_routed, t_direct))
            if t_routed < t_direct + 1.0:
                break
    assert tries[-1][0] < tries[-1][1] + 1.0, tries


async def test_midstream_failure_without_migration_ends_with_sse_error_event(ups: list[FakeUpstream]) -> None:
    cm, srv = await _serve_with(ups, migration_limit=0)  # --migration-limit 0: never continued
    try:
        for u in ups:
            u.die_after_chunks = 3
        async with httpx.AsyncClient(base_url=srv.url, timeout=5) as c:
            lines = await sse_data(c, "/v1/chat/completions", {**CHAT, "stream": True})
        assert len(lines) == 4
        err = json.loads(lines[-1][6:])
        assert err["error"]["code"] == "upstream_stream_error"
        assert sum(u.requests for u in ups) == 1  # never retried mid-stream
    finally:
        await cm.__aexit__(None, None, None)


async def test_client_disconnect_cancels_upstream(
    srv: RunningServer, ups: list[FakeUpstream], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="uvicorn.error")
    for u in ups:
        u.chunk_delay = 0.05
    async with httpx.AsyncClient(base_url=srv.url, timeout=5) as c:
        await leave_mid_stream(c, "/v1/chat/completions", {**CHAT, "stream": True})
        # the server notices, releases the worker and closes the upstream connection
        await until(
            lambda: (
                not sum(ep.in_flight for ep in srv.core.table.by_id.values())
                and not any(u.connections for u in ups)
            )
        )
        streaming = [t for u in ups for t in u.tasks if not t.done()]
        await asyncio.sleep(0.2)
        assert all(t.done() for t in streaming)
    # a client leaving is no server error (uvicorn said "ASGI callable returned without
    # completing response" when the request ended on EOF before the connection was lost)
    assert not [r for r in caplog.records if r.name == "uvicorn.error"], caplog.text


BAD_CHATS: list[tuple[bytes, str | None]] = [  # (body, the param the 400 names)
    (b"{not json", None),
    (b"", None),
    (b"[1, 2]", None),
    (b'{"messages": [{"role": "user", "content": "x"}]}', "model"),
    (b'{"model": 7, "messages": [{"role": "user", "content": "x"}]}', "model"),
    (b'{"model": "fake-model", "messages": "hi"}', "messages"),
    (b'{"model": "fake-model", "messages": []}', "messages"),
    (b'{"model": "fake-model", "messages": [3]}', "messages[0]"),
    (b'{"model": "fake-model", "messages": [{"role": "user"}], "stream": "yes"}', "stream"),
]
BAD_COMPLETIONS: list[tuple[bytes, str | None]] = [
    (b'{"model": "fake-model"}', "prompt"),
    (b'{"model": "fake-model", "prompt": 5}', "prompt"),
    (b'{"model": "fake-model", "prompt": [1, "a"]}', "prompt"),
]


@pytest.mark.parametrize(
    ("route", "raw", "status", "param"),
    [
        *(("/v1/chat/completions", raw, 400, param) for raw, param in BAD_CHATS),
        *(("/v1/completions", raw, 400, param) for raw, param in BAD_COMPLETIONS),
        ("/v1/completions", b'{"model": "nope", "prompt": "x"}', 404, "model"),
        (
            "/v1/messages",
            b'{"model": "fake-model", "messages": [{"role": "user", "content": "x"}]}',
            400,
            "max_tokens",
        ),
    ],
)
async def test_bad_input_gets_openai_shaped_4xx(
    srv: RunningServer, route: str, raw: bytes, status: int, param: str | None
) -> None:
    async with httpx.AsyncClient(base_url=srv.url) as c:
        r = await c.post(route, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    body = r.json()
    if route == "/v1/messages":
        assert body["type"] == "error" and body["error"]["message"]
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert body["error"]["param"] == param
    if status == 404:
        assert "fake-model" in body["error"]["message"]


async def test_body_over_limit_is_413(ups: list[FakeUpstream]) -> None:
    cm, srv = await _serve_with(ups, max_body_bytes=1000)
    try:
        async with httpx.AsyncClient(base_url=srv.url) as c:
            big = {**CHAT, "pad": "x" * 2000}
            r = await c.post("/v1/chat/completions", json=big)
            assert r.status_code == 413
            assert r.json()["error"]["code"] == "request_too_large"

            async def chunks() -> AsyncIterator[bytes]:  # no content-length: counted while reading
                for _ in range(3):
                    yield b" " * 600

            r = await c.post("/v1/chat/completions", content=chunks())
            assert r.status_code == 413
            assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200
    finally:
        await cm.__aexit__(None, None, None)


async def test_unknown_route_and_method_are_json_errors(srv: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=srv.url) as c:
        r = await c.get("/v1/nothing")
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_route"
        r = await c.get("/v1/chat/completions")
        assert r.status_code == 405
