"""Run an Infera server in the test's event loop on a free loopback port.

store = MemoryStore()
async with serving(settings_for(), hooks, store) as srv:
    store.put(record)               # the fleet changes live
    await srv.wait_workers(1)
    httpx.post(srv.url + "/v1/chat/completions", ...)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import httpx
import uvicorn

from infera_core.discovery.memory import MemoryDiscovery, MemoryStore
from infera_core.plugin.hooks import InferaHooks
from infera_core.server.app import create_app
from infera_core.server.core import RouterCore
from infera_core.server.kv import KvComponent
from infera_core.server.run import uvicorn_config
from infera_core.server.settings import ServeSettings
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.upstream import FakeUpstream, ScriptedUpstream, record_for
from infera_core.util.net import free_port
from infera_core.worker import WorkerRecord


def settings_for(**overrides: Any) -> ServeSettings:
    """Serve settings for tests: memory discovery, a free port, round-robin, short timeouts."""
    values: dict[str, Any] = {
        "discovery": "memory",
        "port": free_port(),
        "router_policy": "round-robin",  # serve's default is kv-aware when installed
        "connect_timeout": 2.0,
        "first_byte_timeout": 10.0,
        "stream_idle_timeout": 10.0,
    }
    values.update(overrides)
    return ServeSettings(**values)


async def until(predicate: Callable[[], bool], within: float = 3.0, step: float = 0.01) -> None:
    """Poll ``predicate`` until it holds; ``TimeoutError`` after ``within`` seconds."""
    async with asyncio.timeout(within):
        while not predicate():  # noqa: ASYNC110 (state without an event to wait on)
            await asyncio.sleep(step)


async def eventually(predicate: Callable[[], bool], within: float = 10.0, step: float = 0.02) -> bool:
    """Poll ``predicate`` for up to ``within`` seconds: whether it holds at the end (for a
    caller that acts on a miss, e.g. sends again; else use :func:`until`)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(step)
    return predicate()


def greedy_chat_stream(
    model: str, max_tokens: int, content: str = "Write a long story about a router that never drops a stream."
) -> dict[str, Any]:
    """A streamed chat body that generates exactly ``max_tokens`` the same way every time
    (``temperature 0``, ``ignore_eos``) and reports usage: what the migration tests replay."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def chat_stream_text(events: list[dict[str, Any]]) -> str:
    """The text a client reads from a chat stream's decoded events (every choice's ``delta``)."""
    return "".join(
        (ch.get("delta") or {}).get("content") or "" for e in events for ch in e.get("choices") or []
    )


def assert_continued_like(got: list[dict[str, Any]], want: list[dict[str, Any]], max_tokens: int) -> None:
    """A migrated chat stream's events (``got``) read as the unbroken one (``want``): no error,
    the same text, one id, one ``length`` finish, and one usage report of the whole prompt and
    ``max_tokens`` completion tokens."""
    assert not any("error" in e for e in got), got[-1]
    assert chat_stream_text(want) and chat_stream_text(got) == chat_stream_text(want)
    assert len({e["id"] for e in got}) == 1
    assert [ch["finish_reason"] for e in got for ch in e["choices"] if ch.get("finish_reason")] == ["length"]
    usage = [e["usage"] for e in got if e.get("usage")]
    assert len(usage) == 1 and usage[0]["completion_tokens"] == max_tokens
    assert usage[0]["prompt_tokens"] == next(e["usage"] for e in want if e.get("usage"))["prompt_tokens"]


async def sse_data(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> list[str]:
    """POST ``body`` streamed (the answer must be a 200): its ``data: `` lines, to the end."""
    async with client.stream("POST", url, json=body) as r:
        assert r.status_code == 200, (r.status_code, await r.aread())
        return [line async for line in r.aiter_lines() if line.startswith("data: ")]


async def post_at_once(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], n: int
) -> list[httpx.Response]:
    """``n`` POSTs of ``body`` to ``url`` at once: their responses, lowest status code first."""
    responses = await asyncio.gather(*(client.post(url, json=body) for _ in range(n)))
    return sorted(responses, key=lambda r: r.status_code)


async def leave_mid_stream(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> None:
    """POST ``body`` streamed and go away after the first bytes (a client leaving mid-response)."""
    async with client.stream("POST", url, json=body) as r:
        assert r.status_code == 200, (r.status_code, await r.aread())
        async for _ in r.aiter_bytes():
            break


class RunningServer:
    def __init__(self, url: str, core: RouterCore, store: MemoryStore) -> None:
        self.url = url
        self.core = core
        self.store = store

    async def wait_workers(self, n: int, within: float = 5.0) -> None:
        """Wait until the server's table holds ``n`` workers."""
        await until(lambda: len(self.core.table.by_id) == n, within)

    async def add_workers(self, *records: WorkerRecord, within: float = 5.0) -> None:
        """Put ``records`` in the memory fleet and wait until the server's table holds them."""
        for record in records:
            self.store.put(record)
        await until(lambda: all(r.worker_id in self.core.table.by_id for r in records), within)


@contextlib.asynccontextmanager
async def serving(
    settings: ServeSettings,
    hooks: InferaHooks,
    store: MemoryStore | None = None,
    kv: KvComponent | None = None,
) -> AsyncIterator[RunningServer]:
    """Serve ``create_app(settings, hooks)`` over a memory fleet until the block exits."""
    store = store or MemoryStore()
    app = create_app(settings, hooks, discovery=MemoryDiscovery(store), kv=kv, start_discovery=True)
    server = uvicorn.Server(uvicorn_config(app, settings, log_level="error"))
    server.config.loop = "none"
    task = asyncio.ensure_future(server.serve())
    try:
        async with asyncio.timeout(10):
            while not server.started:
                if task.done():
                    task.result()
                    raise RuntimeError("server exited during start-up")
                await asyncio.sleep(0.01)
        yield RunningServer(f"http://{settings.host}:{settings.port}", app.state.core, store)
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)


@contextlib.asynccontextmanager
async def serving_fleet(
    *records: WorkerRecord, settings: ServeSettings | None = None
) -> AsyncIterator[tuple[RunningServer, httpx.AsyncClient]]:
    """A router (``settings``, default ones if None; the installed plugins) serving ``records``
    once they are all in its table; and a client of the router."""
    async with (
        serving(settings or settings_for(), make_hooks()) as srv,
        httpx.AsyncClient(base_url=srv.url) as client,
    ):
        await srv.add_workers(*records)
        yield srv, client


@contextlib.asynccontextmanager
async def serving_upstreams(
    ups: Sequence[FakeUpstream] = (), **settings: Any
) -> AsyncIterator[RunningServer]:
    """A router (``settings_for(**settings)``, the installed plugins) serving the fake upstreams
    ``ups`` once its table holds them all."""
    async with serving(settings_for(**settings), make_hooks()) as srv:
        for u in ups:
            srv.store.put(record_for(u))
        await srv.wait_workers(len(ups))
        yield srv


@contextlib.asynccontextmanager
async def serving_one_scripted(
    reply: bytes,
) -> AsyncIterator[tuple[ScriptedUpstream, RunningServer, httpx.AsyncClient]]:
    """A router (default settings, no plugins) with one worker ``w0`` of ``fake-model``: a
    :class:`ScriptedUpstream` answering every request with ``reply``; and a client of the router."""
    async with ScriptedUpstream(lambda conn, req: reply) as engine:
        w0 = WorkerRecord(worker_id="w0", url=engine.url, model="fake-model", engine="fake")
        async with serving_fleet(w0) as (srv, client):
            yield engine, srv, client
