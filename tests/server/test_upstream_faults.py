"""Misbehaving workers against the upstream hop: bytes after a response, a full pool.

A worker that writes anything after a complete response must not poison the pooled
connection (the next request used to inherit a half-parsed message and get a 502), and a
request waiting for a connection at ``--upstream-connections`` gives up after
``--pool-timeout`` with a clear 503 instead of queueing for ever.
"""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import AbstractAsyncContextManager

import httpx
import pytest

from infera_core.scheduling.types import Endpoint
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import serving, settings_for, until
from infera_core.testing.upstream import ScriptedUpstream, fake_upstreams, native_upstream, record_for
from infera_core.transports.http.native import NativeUpstream
from infera_core.transports.upstreams import PoolTimeoutError
from infera_core.worker import WorkerRecord

JSON = b'{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}'
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
OK = b'{"ok": true}'
REPLY = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(OK), OK)

TRAILERS = [
    pytest.param(b"garbage", id="garbage"),
    pytest.param(b"HTTP/1.1 200 OK\r\ncontent-le", id="half-a-response"),
    pytest.param(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nab", id="half-a-body"),
    pytest.param(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", id="an-unasked-response"),
]


def endpoint(url: str, name: str = "w") -> Endpoint:
    return Endpoint(WorkerRecord(worker_id=name, url=url, model="fake-model", engine="fake"))


def native(
    max_connections: int = 64, pool_timeout: float = 10.0
) -> AbstractAsyncContextManager[NativeUpstream]:
    return native_upstream(
        first_byte_timeout=30.0, idle_timeout=30.0, max_connections=max_connections, pool_timeout=pool_timeout
    )


@pytest.mark.parametrize("trailer", TRAILERS)
async def test_bytes_after_a_complete_response_never_reach_the_next_request(trailer: bytes) -> None:
    async with ScriptedUpstream(lambda conn, req: REPLY + trailer) as srv, native() as client:
        for _ in range(3):
            resp = await client.open(endpoint(srv.url), "/v1/chat/completions", JSON)
            assert resp.status == 200
            assert await resp.read() == OK
            resp.release()
        # the poisoned connection was closed each time instead of going back to the pool
        assert srv.connections == 3


async def test_a_clean_worker_still_gets_its_connection_reused() -> None:
    async with ScriptedUpstream(lambda conn, req: REPLY + b"\r\n") as srv, native() as client:
        for _ in range(3):
            resp = await client.open(endpoint(srv.url), "/v1/chat/completions", JSON)
            assert await resp.read() == OK
            resp.release()
        assert srv.connections == 1  # a stray CRLF between messages is allowed by HTTP/1.1


@pytest.mark.parametrize("transport", ["native", "aiohttp"])
async def test_a_desynced_worker_behind_the_router_answers_every_request(transport: str) -> None:
    settings = settings_for(http_client=transport)
    async with fake_upstreams(1) as ups, serving(settings, make_hooks()) as srv:
        ups[0].trailing = b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nleft"
        srv.store.put(record_for(ups[0]))
        await srv.wait_workers(1)
        async with httpx.AsyncClient(base_url=srv.url) as c:
            codes = [(await c.post("/v1/chat/completions", json=CHAT)).status_code for _ in range(5)]
        assert codes == [200] * 5


async def test_waiting_for_a_pooled_connection_times_out() -> None:
    async with fake_upstreams(1) as ups, native(max_connections=1, pool_timeout=0.3) as client:
        ups[0].hang = True
        ep = endpoint(ups[0].url, "w0")
        holder = asyncio.ensure_future(client.open(ep, "/v1/chat/completions", JSON))
        await until(lambda: client.open_connections == 1)
        t0 = time.monotonic()
        with pytest.raises(PoolTimeoutError) as info:
            await client.open(ep, "/v1/chat/completions", JSON)
        assert 0.25 <= time.monotonic() - t0 < 3
        assert "--upstream-connections 1" in info.value.reason
        holder.cancel()
        await asyncio.gather(holder, return_exceptions=True)
        # the cap is free again: the next request gets a connection at once
        ups[0].hang = False
        resp = await client.open(ep, "/v1/chat/completions", JSON)
        assert json.loads(await resp.read())["worker"] == "w0"
        resp.release()


async def test_a_woken_waiter_that_times_out_passes_the_room_on() -> None:
    async with fake_upstreams(1) as ups, native(max_connections=1, pool_timeout=5.0) as client:
        ups[0].delay = 0.2
        ep = endpoint(ups[0].url, "w0")

        async def one() -> bytes:
            resp = await client.open(ep, "/v1/chat/completions", JSON)
            try:
                return await resp.read()
            finally:
                resp.release()

        bodies = await asyncio.gather(*(one() for _ in range(6)))
        assert len(bodies) == 6 and client.open_connections <= 1


async def test_the_pool_timeout_is_a_clear_503_not_a_worker_fault() -> None:
    settings = settings_for(upstream_connections=1, pool_timeout=0.3, breaker_failures=1)
    async with fake_upstreams(1) as ups, serving(settings, make_hooks()) as srv:
        srv.store.put(record_for(ups[0]))
        await srv.wait_workers(1)
        ups[0].delay = 1.5
        async with httpx.AsyncClient(base_url=srv.url, timeout=10) as c:
            slow = asyncio.ensure_future(c.post("/v1/chat/completions", json=CHAT))
            await until(lambda: ups[0].requests == 1)
            r = await c.post("/v1/chat/completions", json=CHAT)
            assert r.status_code == 503
            assert r.headers["retry-after"] == "1"
            err = r.json()["error"]
            assert err["code"] == "upstream_pool_timeout" and "--upstream-connections" in err["message"]
            assert (await slow).status_code == 200
            workers = (await c.get("/v1/workers")).json()["data"]
            assert workers[0]["breaker"] == "closed"  # the router's cap is not the worker's fault
