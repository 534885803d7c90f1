"""A stream whose worker is killed mid-way finishes on another worker, seamlessly.

Real sim engines (separate processes, deterministic like a greedy engine: the next token
depends on the context only) behind a real router. The same request is sent twice: once
undisturbed, once with the serving sim killed (SIGKILL) after k chunks. The client must
see the same text, one ``id``, one ``created``, one role chunk, one finish reason and a
usage whose completion tokens equal ``max_tokens``.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from infera_sim.testing import SimHandle, start_sims

from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import RunningServer, serving, settings_for

MODEL = "sim-model"
MAX = 80
CHAT = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "tell me a long story about routers"}],
    "max_tokens": MAX,
    "temperature": 0,
    "ignore_eos": True,
    "stream": True,
    "stream_options": {"include_usage": True},
}
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
    # 8 ms per token: a stream of 80 lasts long enough to be cut anywhere
    with start_sims(2, model=MODEL, itl_base_ms=8, kv_events_port=None, kv_replay_port=None) as out:
        yield out


@asynccontextmanager
async def router(sims: list[SimHandle], **settings: Any) -> AsyncIterator[RunningServer]:
    async with serving(settings_for(**settings), make_hooks()) as srv:
        for i, s in enumerate(sims):
            srv.store.put(s.record(f"w{i}"))
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


def chat_text(events: list[dict[str, Any]]) -> str:
    return "".join(
        (ch.get("delta") or {}).get("content") or "" for e in events for ch in e.get("choices") or []
    )


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
        assert chat_text(got) == chat_text(want)
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
