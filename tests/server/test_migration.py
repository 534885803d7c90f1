"""A stream whose worker is killed mid-way finishes on another worker, seamlessly.

Real sim engines (separate processes, deterministic like a greedy engine: the next token
depends on the context only) behind a real router. The same request is sent twice: once
undisturbed, once with the serving sim killed (SIGKILL) after k chunks. The client must
see the same text, one ``id``, one ``created``, one role chunk, one finish reason and a
usage whose completion tokens equal ``max_tokens``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from infera_sim.testing import SimHandle, start_sims

from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import (
    RunningServer,
    chat_stream_text,
    greedy_chat_stream,
    serving,
    settings_for,
    until,
)
from infera_core.testing.upstream import fake_upstreams, record_for
from infera_core.worker import Status

MODEL = "sim-model"
MAX = 120
CHAT = greedy_chat_stream(MODEL, MAX, "tell me a long story about routers")
COMPLETION = {
    "model": MODEL,
    "prompt": "Once upon a time",
    "max_tokens": MAX,
    "temperature": 0,
    "ignore_eos": True,
    "stream": True,
    "stream_options": {"include_usage": True},
}


@pytest.fixture
def sims() -> Iterator[list[SimHandle]]:
    # 12 ms per token: a stream of 120 lasts about 1.5 s, long enough to be cut anywhere
    with start_sims(2, model=MODEL, itl_base_ms=12, kv_events_port=None, kv_replay_port=None) as out:
        yield out


@asynccontextmanager
async def router(sims: list[SimHandle], engine: str = "sim", **settings: Any) -> AsyncIterator[RunningServer]:
    """A router over ``sims``; ``engine="vllm"`` in their records makes it ask for token ids
    (the sim streams them as vLLM does with ``return_token_ids``)."""
    async with serving(settings_for(**settings), make_hooks()) as srv:
        for i, s in enumerate(sims):
            srv.store.put(s.record(f"w{i}", engine=engine))
        await srv.wait_workers(len(sims))
        yield srv


def _kill(sims: list[SimHandle], worker: str) -> None:
    sim = sims[int(worker[1:])]
    os.kill(sim.proc.pid, signal.SIGKILL)
    sim.proc.wait(10)


async def stream(
    c: httpx.AsyncClient,
    path: str,
    body: dict[str, Any],
    kill_after: int | None = None,
    sims: list[SimHandle] | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[list[dict[str, Any]], list[str], str]:
    """The stream's data events (JSON), its raw ``data:`` payloads, and the first worker."""
    events: list[dict[str, Any]] = []
    raw: list[str] = []
    async with c.stream("POST", path, json=body, headers=headers) as r:
        assert r.status_code == 200, await r.aread()
        worker = r.headers.get("x-infera-worker", "")
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            payload = line[6:]
            raw.append(payload)
            if payload != "[DONE]":
                events.append(json.loads(payload))
            if kill_after is not None and len(events) == kill_after:
                assert sims is not None
                _kill(sims, worker)
    return events, raw, worker


def completion_text(events: list[dict[str, Any]]) -> str:
    return "".join(ch.get("text") or "" for e in events for ch in e.get("choices") or [])


def usage(events: list[dict[str, Any]]) -> dict[str, Any]:
    got = [e["usage"] for e in events if e.get("usage")]
    assert len(got) == 1, got
    return got[0]


def finishes(events: list[dict[str, Any]]) -> list[str]:
    return [ch["finish_reason"] for e in events for ch in e.get("choices") or [] if ch.get("finish_reason")]


@pytest.mark.parametrize("k", [1, 10, 60])
async def test_chat_stream_killed_after_k_chunks_is_byte_identical(sims: list[SimHandle], k: int) -> None:
    async with router(sims) as srv, httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
        want, _, _ = await stream(c, "/v1/chat/completions", CHAT)
        got, raw, first = await stream(c, "/v1/chat/completions", CHAT, kill_after=k, sims=sims)
        assert raw[-1] == "[DONE]"
        assert not any("error" in e for e in got), got
        assert chat_stream_text(got) == chat_stream_text(want)
        assert len({e["id"] for e in got}) == 1 and len({e["created"] for e in got}) == 1
        roles = [ch for e in got for ch in e["choices"] if (ch.get("delta") or {}).get("role")]
        assert len(roles) == 1
        assert finishes(got) == ["length"]
        u, w = usage(got), usage(want)
        assert u["completion_tokens"] == MAX
        assert u["prompt_tokens"] == w["prompt_tokens"]
        assert u["total_tokens"] == w["total_tokens"]
        metrics = (await c.get("/metrics")).text
        assert 'infera_migrations_total{model="sim-model",reason="upstream_closed",result="resumed"} 1.0' in (
            metrics
        )
        assert "infera_migration_resume_seconds_count" in metrics
        assert first
        stats = (await c.get("/v1/admin/stats")).json()  # what the dashboard's Migrations tile shows
        assert stats["migrations"] == {"upstream_closed resumed": 1.0}
        assert sum(stats["histograms"]["resume"]["series"]["sim-model"]["counts"]) == 1


async def test_completion_stream_killed_mid_way_is_byte_identical(sims: list[SimHandle]) -> None:
    async with router(sims) as srv, httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
        want, _, _ = await stream(c, "/v1/completions", COMPLETION)
        got, raw, _ = await stream(c, "/v1/completions", COMPLETION, kill_after=10, sims=sims)
        assert raw[-1] == "[DONE]" and not any("error" in e for e in got)
        assert completion_text(got) == completion_text(want)
        assert len({e["id"] for e in got}) == 1 and len({e["created"] for e in got}) == 1
        assert finishes(got) == ["length"]
        assert usage(got)["completion_tokens"] == MAX
        assert usage(got)["prompt_tokens"] == usage(want)["prompt_tokens"]


async def anthropic_stream(
    c: httpx.AsyncClient,
    body: dict[str, Any],
    kill_after: int | None = None,
    sims: list[SimHandle] | None = None,
    srv: RunningServer | None = None,
) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    name = ""
    deltas = 0
    async with c.stream("POST", "/v1/messages", json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                out.append((name, json.loads(line[6:])))
                deltas += name == "content_block_delta"
                if kill_after is not None and deltas == kill_after:
                    assert sims is not None and srv is not None
                    # /v1/messages names no worker: the one serving it has the request in flight
                    busy = [w for w, ep in srv.core.table.by_id.items() if ep.in_flight]
                    _kill(sims, busy[0])
    return out


async def test_anthropic_stream_killed_mid_way_is_seamless(sims: list[SimHandle]) -> None:
    body = {
        "model": MODEL,
        "max_tokens": MAX,
        "temperature": 0,
        "messages": [{"role": "user", "content": "tell me a long story about routers"}],
        "stream": True,
    }
    async with router(sims) as srv, httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
        want = await anthropic_stream(c, body)
        got = await anthropic_stream(c, body, kill_after=10, sims=sims, srv=srv)
        text = lambda evs: "".join(d["delta"]["text"] for n, d in evs if n == "content_block_delta")  # noqa: E731
        assert text(got) == text(want) and text(got)
        names = [n for n, _ in got]
        assert "error" not in names
        assert names.count("message_start") == 1 and names.count("content_block_start") == 1
        assert names[-1] == "message_stop"
        delta = next(d for n, d in got if n == "message_delta")
        assert delta["delta"]["stop_reason"] == "max_tokens"
        assert delta["usage"]["output_tokens"] == MAX
        assert (
            delta["usage"]["input_tokens"]
            == next(d for n, d in want if n == "message_delta")["usage"]["input_tokens"]
        )


@pytest.mark.parametrize(
    ("extra", "headers", "why"),
    [
        ({"n": 2}, None, "n > 1"),
        ({"logprobs": True, "top_logprobs": 2}, None, "logprobs were requested"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
            None,
            "structured",
        ),
        ({"guided_regex": "[a-z ]+"}, None, "guided decoding"),
        ({"seed": 7, "temperature": 0.8}, None, "a seed with sampling"),
        ({}, {"X-Infera-Migration": "off"}, "the request opted out"),
    ],
)
async def test_what_cannot_continue_exactly_fails_with_a_clear_error(
    sims: list[SimHandle], extra: dict[str, Any], headers: dict[str, str] | None, why: str
) -> None:
    body = {**CHAT, **extra}
    async with router(sims) as srv, httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
        _, raw, _ = await stream(c, "/v1/chat/completions", body, kill_after=5, sims=sims, headers=headers)
        err = json.loads(raw[-1])["error"]
        assert err["code"] == "upstream_stream_error"
        assert "failed mid-stream" in err["message"] and f"not continued elsewhere: {why}" in err["message"]
        metrics = (await c.get("/metrics")).text
        assert 'result="resumed"' not in metrics


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
async def test_a_non_streamed_answer_that_breaks_is_retried_whole(path: str) -> None:
    body: dict[str, Any] = {
        "model": "fake-model",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}],
    }
    async with fake_upstreams(2) as ups, serving(settings_for(), make_hooks()) as srv:
        for u in ups:
            srv.store.put(record_for(u))
        await srv.wait_workers(2)
        ups[0].break_body = True  # headers and half the answer, then the connection drops
        async with httpx.AsyncClient(base_url=srv.url, timeout=20) as c:
            answers = [await c.post(path, json=body) for _ in range(4)]
            assert [r.status_code for r in answers] == [200] * 4, [r.text for r in answers]
            assert ups[0].requests >= 1  # round-robin sent it some: each was retried on w1
            metrics = (await c.get("/metrics")).text
            assert 'reason="upstream_closed",result="resumed"' in metrics
            off = await c.post(path, json=body, headers={"X-Infera-Migration": "off"})
            if off.status_code == 200:  # round-robin gave it to w1: the next one goes to w0
                off = await c.post(path, json=body, headers={"X-Infera-Migration": "off"})
            assert off.status_code == 502 and "failed while responding" in off.text


async def test_a_draining_worker_hands_its_streams_over_after_the_grace(sims: list[SimHandle]) -> None:
    async with router(sims, drain_grace=0.2) as srv, httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
        want, _, _ = await stream(c, "/v1/chat/completions", CHAT)
        got: list[dict[str, Any]] = []
        async with c.stream("POST", "/v1/chat/completions", json=CHAT) as r:
            worker = r.headers["x-infera-worker"]
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    got.append(json.loads(line[6:]))
                    if len(got) == 5:  # its launcher got SIGTERM: the record says draining
                        sim = sims[int(worker[1:])]
                        srv.store.put(sim.record(worker, status=Status.DRAINING))
        assert chat_stream_text(got) == chat_stream_text(want)
        assert usage(got)["completion_tokens"] == MAX
        assert sims[int(worker[1:])].proc.poll() is None  # nothing broke: the router moved it
        metrics = (await c.get("/metrics")).text
        assert 'infera_migrations_total{model="sim-model",reason="drain",result="resumed"} 1.0' in metrics


async def test_a_draining_worker_without_a_peer_keeps_its_streams(sims: list[SimHandle]) -> None:
    async with (
        router(sims[:1], drain_grace=0.05) as srv,
        httpx.AsyncClient(base_url=srv.url, timeout=60) as c,
    ):
        got: list[dict[str, Any]] = []
        async with c.stream("POST", "/v1/chat/completions", json=CHAT) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    got.append(json.loads(line[6:]))
                    if len(got) == 5:
                        srv.store.put(sims[0].record("w0", status=Status.DRAINING))
        assert usage(got)["completion_tokens"] == MAX
        assert "infera_migrations_total{" not in (await c.get("/metrics")).text


async def test_a_stream_whose_worker_stops_mid_way_moves_after_the_hang_threshold(
    sims: list[SimHandle],
) -> None:
    async with router(sims, hang_timeout=1.0) as srv, httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
        want, _, _ = await stream(c, "/v1/chat/completions", CHAT)
        got: list[dict[str, Any]] = []
        stopped: list[SimHandle] = []
        try:
            async with c.stream("POST", "/v1/chat/completions", json=CHAT) as r:
                worker = r.headers["x-infera-worker"]
                async for line in r.aiter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        got.append(json.loads(line[6:]))
                        if len(got) == 5:  # the engine freezes (SIGSTOP): its socket stays open
                            stopped.append(sims[int(worker[1:])])
                            os.kill(stopped[0].proc.pid, signal.SIGSTOP)
        finally:
            for sim in stopped:
                os.kill(sim.proc.pid, signal.SIGCONT)
        assert chat_stream_text(got) == chat_stream_text(want)
        assert usage(got)["completion_tokens"] == MAX
        metrics = (await c.get("/metrics")).text
        assert 'infera_migrations_total{model="sim-model",reason="hung",result="resumed"} 1.0' in metrics


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_with_token_ids_the_continuation_replays_the_ids(
    sims: list[SimHandle], path: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="infera.server.migrate")
    body = CHAT if path.endswith("chat/completions") else COMPLETION
    text = chat_stream_text if path.endswith("chat/completions") else completion_text
    async with router(sims, engine="vllm") as srv, httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
        want, _, _ = await stream(c, path, body)
        got, raw, _ = await stream(c, path, body, kill_after=10, sims=sims)
        assert text(got) == text(want)
        assert not any("token_ids" in line for line in raw)  # asked by the router, not for the client
        assert len({e["id"] for e in got}) == 1 and {e["object"] for e in got} == {want[0]["object"]}
        assert usage(got)["completion_tokens"] == MAX
        assert usage(got)["prompt_tokens"] == usage(want)["prompt_tokens"]
        assert finishes(got) == ["length"]
        metrics = (await c.get("/metrics")).text
        assert 'reason="upstream_closed",result="resumed"} 1.0' in metrics
        assert "token ids replayed" in caplog.text


async def test_a_models_migration_limit_in_the_router_config_wins(
    sims: list[SimHandle], tmp_path: Path
) -> None:
    config = tmp_path / "router.yaml"
    config.write_text("preset: round-robin\nmodels:\n  sim-model: {migration_limit: 0}\n")
    async with (
        router(sims, router_config=config) as srv,
        httpx.AsyncClient(base_url=srv.url, timeout=60) as c,
    ):
        _, raw, _ = await stream(c, "/v1/chat/completions", CHAT, kill_after=5, sims=sims)
        assert json.loads(raw[-1])["error"]["code"] == "upstream_stream_error"  # its limit is 0
        plain = {k: v for k, v in CHAT.items() if k not in ("stream", "stream_options")}
        assert (
            await c.post("/v1/chat/completions", json=plain)
        ).status_code == 200  # the profile is the default


async def test_a_continuation_never_goes_back_to_the_worker_that_failed_it(sims: list[SimHandle]) -> None:
    """The killed worker's record lingers (its lease has not run out) and, least loaded, it is the
    policy's pick: the continuation must still go to the other worker, at the first try (no retries
    here), also when it passes through the router queue (on by default)."""
    long = {**CHAT, "max_tokens": 600}  # ~7 s: still running when the short stream is cut
    async with (
        router(sims, router_policy="least-load", router_mode="direct", request_max_retries=0) as srv,
        httpx.AsyncClient(base_url=srv.url, timeout=60) as c,
    ):
        pinned = {"x-worker-instance-id": "w1"}
        busy = [
            asyncio.create_task(stream(c, "/v1/chat/completions", long, headers=pinned)) for _ in range(2)
        ]
        w1 = next(ep for ep in srv.core.table.candidates(MODEL) if ep.worker_id == "w1")
        await until(lambda: w1.in_flight == 2, within=30)
        got, raw, first = await stream(c, "/v1/chat/completions", CHAT, kill_after=5, sims=sims)
        assert first == "w0", first  # the least loaded
        assert raw[-1] == "[DONE]", raw[-1]
        assert usage(got)["completion_tokens"] == MAX
        metrics = (await c.get("/metrics")).text
        assert (
            'infera_migrations_total{model="sim-model",reason="upstream_closed",result="resumed"} 1.0'
            in metrics
        )
        for events, _, worker in await asyncio.gather(*busy):
            assert worker == "w1" and usage(events)["completion_tokens"] == 600
