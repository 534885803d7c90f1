"""Every routed request releases its scheduler accounting exactly once, on every path.

The kv-aware profile's ``load`` scorer adds each request's prompt tokens to the chosen
worker's load and takes them off in ``finished()``. A path that skips ``finished()``
(a client that disconnects before the first byte used to) leaves the tokens there for
ever: the worker looks busier and busier and stops getting traffic. Each test drives
one path through a real server and real upstreams, then checks that ``finished()``
balanced every routing decision and that no worker still carries load.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from infera_core.request import RequestContext
from infera_core.scheduling.types import Endpoint
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import RunningServer, leave_mid_stream, serving, settings_for, until
from infera_core.testing.upstream import FakeUpstream, fake_upstreams, record_for

PROMPT = "word " * 2000
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": PROMPT}]}
STREAM = {**CHAT, "stream": True}


class Ledger:
    """Stands in front of one server's scheduler: records every decision and every ``finished()``."""

    def __init__(self, srv: RunningServer) -> None:
        self.open: dict[tuple[str, str], int] = {}
        self.routed = 0
        self.finished_calls = 0
        self._scheduler = srv.core.scheduler
        srv.core.scheduler = self  # type: ignore[assignment]
        self.endpoints: Callable[[], list[Endpoint]] = lambda: list(srv.core.table.by_id.values())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._scheduler, name)

    def schedule(self, ctx: RequestContext, exclude: Any = ()) -> Endpoint:
        ep = self._scheduler.schedule(ctx, exclude)
        key = (ctx.request_id, ep.worker_id)
        self.open[key] = self.open.get(key, 0) + 1
        self.routed += 1
        return ep

    def finished(self, ctx: RequestContext, ep: Endpoint, ok: bool) -> None:
        key = (ctx.request_id, ep.worker_id)
        assert self.open.get(key), f"finished() without a routing decision for {key}"
        self.open[key] -= 1
        if not self.open[key]:
            del self.open[key]
        self.finished_calls += 1
        self._scheduler.finished(ctx, ep, ok)

    async def balanced(self, routed_at_least: int = 1) -> None:
        """Every decision got its ``finished()`` and no worker still carries a request or a token."""
        await until(
            lambda: (
                not self.open
                and self.routed >= routed_at_least
                and all(ep.in_flight == 0 and ep.in_flight_prompt_tokens == 0 for ep in self.endpoints())
            ),
            within=10,
        )
        assert self.finished_calls == self.routed


@asynccontextmanager
async def stack(**settings: Any) -> AsyncIterator[tuple[RunningServer, Ledger, list[FakeUpstream]]]:
    serve = settings_for(router_policy="kv-aware", **settings)
    async with fake_upstreams(2) as ups, serving(serve, make_hooks()) as srv:
        for u in ups:
            srv.store.put(record_for(u))
        await srv.wait_workers(2)
        yield srv, Ledger(srv), ups


async def _gone_after(c: httpx.AsyncClient, seconds: float, body: dict[str, Any]) -> None:
    """A client that gives up after ``seconds`` (httpx closes its connection)."""
    with pytest.raises(httpx.TimeoutException):
        await c.post("/v1/chat/completions", json=body, timeout=seconds)


async def test_success_releases_accounting() -> None:
    async with stack() as (srv, ledger, _), httpx.AsyncClient(base_url=srv.url) as c:
        for body in (CHAT, STREAM):
            r = await c.post("/v1/chat/completions", json=body)
            assert r.status_code == 200
        await ledger.balanced(2)


async def test_worker_errors_and_retries_release_accounting() -> None:
    async with stack() as (srv, ledger, ups), httpx.AsyncClient(base_url=srv.url) as c:
        ups[0].status = 500  # every request that lands there is retried on w1
        ups[1].status = 200
        for _ in range(4):
            assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200
        ups[1].status = 400  # a client error passes through
        ups[0].status = 400
        assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 400
        ups[0].status = ups[1].status = 503  # everything fails: the last error comes back
        assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 503
        await ledger.balanced(6)


async def test_dead_worker_retry_releases_accounting() -> None:
    async with stack() as (srv, ledger, ups), httpx.AsyncClient(base_url=srv.url) as c:
        await ups[0].stop()
        for _ in range(4):
            assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200
        await ledger.balanced(4)


async def test_disconnect_before_the_first_byte_releases_accounting() -> None:
    async with stack() as (srv, ledger, ups), httpx.AsyncClient(base_url=srv.url) as c:
        for u in ups:
            u.delay = 30.0
        for body in (CHAT, STREAM):
            await _gone_after(c, 0.3, body)
        await ledger.balanced(2)
        # the upstream requests were cancelled too: the workers' connections closed
        await until(lambda: all(not u.connections for u in ups), within=5)


async def test_disconnect_mid_stream_releases_accounting() -> None:
    async with stack() as (srv, ledger, ups), httpx.AsyncClient(base_url=srv.url) as c:
        for u in ups:
            u.chunk_delay = 0.05
        await leave_mid_stream(c, "/v1/chat/completions", STREAM)
        await ledger.balanced(1)


async def test_disconnect_while_waiting_for_a_pooled_connection_releases_accounting() -> None:
    async with (
        stack(upstream_connections=1, pool_timeout=30.0) as (srv, ledger, ups),
        httpx.AsyncClient(base_url=srv.url) as c,
    ):
        for u in ups:
            u.delay = 30.0
        holder = asyncio.ensure_future(c.post("/v1/chat/completions", json=CHAT, timeout=60))
        await until(lambda: ledger.routed == 1)
        await _gone_after(c, 0.3, CHAT)  # queued behind the one connection, then gone
        assert ledger.routed == 2
        holder.cancel()
        await asyncio.gather(holder, return_exceptions=True)
        await ledger.balanced(2)


async def test_pool_timeout_releases_accounting() -> None:
    async with (
        stack(upstream_connections=1, pool_timeout=0.2) as (srv, ledger, ups),
        httpx.AsyncClient(base_url=srv.url) as c,
    ):
        ups[0].delay = ups[1].delay = 1.0
        first, second = await asyncio.gather(
            c.post("/v1/chat/completions", json=CHAT), c.post("/v1/chat/completions", json=CHAT)
        )
        assert sorted([first.status_code, second.status_code]) == [200, 503]
        await ledger.balanced(2)


async def test_hung_worker_retry_releases_accounting() -> None:
    async with stack(hang_timeout=0.3) as (srv, ledger, ups), httpx.AsyncClient(base_url=srv.url) as c:
        ups[0].hang = True
        results = [await c.post("/v1/chat/completions", json=CHAT, timeout=10) for _ in range(3)]
        assert [r.status_code for r in results] == [200] * 3
        await ledger.balanced(3)


async def test_disconnect_during_scheduling_sends_nothing_upstream() -> None:
    async with stack() as (srv, ledger, ups), httpx.AsyncClient(base_url=srv.url) as c:
        started, cancelled = asyncio.Event(), asyncio.Event()

        async def slow_tokenizer(ctx: RequestContext) -> None:  # a long prompt being tokenized
            started.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.set()
                raise

        srv.core.prepare = slow_tokenizer
        await _gone_after(c, 0.3, CHAT)
        await asyncio.wait_for(cancelled.wait(), 5)  # the request stopped where it was
        assert started.is_set() and sum(u.requests for u in ups) == 0 and ledger.routed == 0
        srv.core.prepare = None
        assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200
        await ledger.balanced(1)
