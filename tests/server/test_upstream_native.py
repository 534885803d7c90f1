"""The native upstream transport against real HTTP servers on loopback.

``FakeUpstream`` (content-length JSON, chunked SSE) and a scripted raw server for the
awkward cases: ``connection: close``, bodies delimited by the end of the connection, a
keep-alive connection the worker drops while it sits in the pool, garbage.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Callable

import pytest

from infera_core.scheduling.types import Endpoint
from infera_core.testing.upstream import FakeUpstream, ScriptedUpstream, fake_upstreams, record_for
from infera_core.testing.upstream import native_upstream as native
from infera_core.transports.http.native import NativeUpstream
from infera_core.transports.upstreams import UpstreamError
from infera_core.util.net import free_port
from infera_core.worker import WorkerRecord

JSON = b'{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}'
STREAM = JSON[:-1] + b', "stream": true}'
OK = b'{"ok": true}'


def ok(extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s" % (
        len(OK),
        extra,
        OK,
    )


def endpoint(url: str, name: str = "w") -> Endpoint:
    return Endpoint(WorkerRecord(worker_id=name, url=url, model="fake-model", engine="fake"))


@pytest.fixture
async def ups() -> AsyncIterator[list[FakeUpstream]]:
    async with fake_upstreams(2) as out:
        yield out


async def test_content_length_body_and_headers_arrive_intact(ups: list[FakeUpstream]) -> None:
    async with native() as client:
        resp = await client.open(endpoint(ups[0].url), "/v1/chat/completions", JSON)
        assert resp.status == 200 and resp.content_type == "application/json"
        body = json.loads(await resp.read())
        resp.release()
    assert body["worker"] == "w0" and body["usage"]["completion_tokens"] == 1
    assert ups[0].last_body == JSON and ups[0].last_path == "/v1/chat/completions"


async def test_chunked_stream_arrives_decoded_and_complete(ups: list[FakeUpstream]) -> None:
    async with native() as client:
        resp = await client.open(endpoint(ups[0].url), "/v1/chat/completions", STREAM)
        assert resp.content_type == "text/event-stream"
        chunks = [chunk async for chunk in resp]
        resp.release()
    events = b"".join(chunks).split(b"\n\n")
    assert events[-2] == b"data: [DONE]" and len(events) == 64 + 2
    assert all(e.startswith(b"data: {") for e in events[:64])


async def test_keep_alive_reuses_one_connection_per_worker(ups: list[FakeUpstream]) -> None:
    async with native() as client:
        for _ in range(5):
            for up in ups:
                resp = await client.open(endpoint(up.url, up.name), "/v1/completions", JSON)
                await resp.read()
                resp.release()
        assert client.open_connections == 2
        assert [len(u.connections) for u in ups] == [1, 1]
        assert [u.requests for u in ups] == [5, 5]


async def test_a_pooled_connection_the_worker_dropped_is_replaced_once() -> None:
    # each connection answers one request and silently closes on the next: the router's
    # pooled connection is stale by the time the second request is written on it
    async with ScriptedUpstream(lambda conn, req: ok() if req == 0 else None) as srv, native() as client:
        for _ in range(3):
            resp = await client.open(endpoint(srv.url), "/v1/completions", JSON)
            assert resp.status == 200 and await resp.read() == OK
            resp.release()
    assert srv.connections == 3 and srv.requests == 5  # 3 answered + 2 met a closing connection


async def test_a_fresh_connection_closed_before_the_first_byte_is_an_upstream_error() -> None:
    async with ScriptedUpstream(lambda conn, req: None) as srv, native() as client:
        with pytest.raises(UpstreamError) as info:
            await client.open(endpoint(srv.url), "/v1/completions", JSON)
    assert not info.value.timeout and "before responding" in info.value.reason
    assert srv.requests == 1  # not resent: the worker may have seen it


async def test_connection_close_responses_are_not_reused() -> None:
    async with ScriptedUpstream(lambda conn, req: ok(b"connection: close\r\n")) as srv, native() as client:
        for _ in range(3):
            resp = await client.open(endpoint(srv.url), "/v1/completions", JSON)
            assert await resp.read() == OK
            resp.release()
    assert srv.connections == 3


async def test_a_body_delimited_by_the_end_of_the_connection() -> None:
    reply = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\ndata: 1\n\ndata: 2\n\n"
    async with ScriptedUpstream(lambda conn, req: reply, close_after_reply=True) as srv, native() as client:
        resp = await client.open(endpoint(srv.url), "/v1/completions", JSON)
        assert b"".join([c async for c in resp]) == b"data: 1\n\ndata: 2\n\n"
        assert client.open_connections == 0


async def test_an_invalid_response_is_an_upstream_error() -> None:
    async with ScriptedUpstream(lambda conn, req: b"SMTP ready\r\n\r\n") as srv, native() as client:
        with pytest.raises(UpstreamError, match="invalid HTTP response"):
            await client.open(endpoint(srv.url), "/v1/completions", JSON)


async def test_nothing_listening_is_an_upstream_error() -> None:
    async with native() as client:
        with pytest.raises(UpstreamError) as info:
            await client.open(endpoint(f"http://127.0.0.1:{free_port()}"), "/v1/completions", JSON)
    assert not info.value.timeout


async def test_connect_timeout_when_the_worker_accepts_nothing() -> None:
    # a listener whose accept queue is full: the kernel drops further SYNs, connect hangs
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    port = srv.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):
            s = socket.socket()
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                s.connect(("127.0.0.1", port))
            fillers.append(s)
        async with native(connect_timeout=0.3) as client:
            with pytest.raises(UpstreamError) as info:
                await client.open(endpoint(f"http://127.0.0.1:{port}"), "/v1/completions", JSON)
            assert client.open_connections == 0
    finally:
        for s in [*fillers, srv]:
            s.close()
    assert info.value.timeout and "could not connect" in info.value.reason


async def test_first_byte_timeout(ups: list[FakeUpstream]) -> None:
    ups[0].delay = 5.0
    async with native(first_byte_timeout=0.2) as client:
        with pytest.raises(UpstreamError) as info:
            await client.open(endpoint(ups[0].url), "/v1/completions", JSON)
        assert info.value.timeout
        await asyncio.sleep(0.05)
        assert client.open_connections == 0  # the timed-out connection was closed


async def test_idle_stream_timeout_raises_while_reading(ups: list[FakeUpstream]) -> None:
    ups[0].chunk_delay = 2.0
    async with native(idle_timeout=0.2) as client:
        resp = await client.open(endpoint(ups[0].url), "/v1/completions", STREAM)
        with pytest.raises(TimeoutError):
            async for _ in resp:
                pass
        resp.release()


async def test_releasing_an_unfinished_response_closes_the_connection(ups: list[FakeUpstream]) -> None:
    ups[0].chunk_delay = 0.05
    async with native() as client:
        resp = await client.open(endpoint(ups[0].url), "/v1/completions", STREAM)
        async for _ in resp:
            break
        resp.release()  # what a client disconnect does
        await asyncio.wait_for(_until(lambda: not ups[0].connections), 3)
        assert client.open_connections == 0


async def test_a_large_body_read_slowly_arrives_intact() -> None:
    # 4 MiB, far over the read-pause mark, consumed slowly: reading pauses and resumes
    big = bytes(range(256)) * (16 * 1024)
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-length: %d\r\n\r\n"
    async with ScriptedUpstream(lambda conn, req: head % len(big) + big) as srv, native() as client:
        resp = await client.open(endpoint(srv.url), "/v1/completions", JSON)
        got = []
        async for chunk in resp:
            got.append(chunk)
            await asyncio.sleep(0.001)
        resp.release()
        assert b"".join(got) == big
        # complete and kept alive: the next request reuses the connection
        resp = await client.open(endpoint(srv.url), "/v1/completions", JSON)
        assert await resp.read() == big
    assert srv.connections == 1


async def test_a_large_request_body_goes_through_unchanged(ups: list[FakeUpstream]) -> None:
    body = JSON[:-1] + b', "pad": "' + b"x" * 300_000 + b'"}'
    async with native() as client:
        resp = await client.open(endpoint(ups[0].url), "/v1/completions", body)
        await resp.read()
    assert ups[0].last_body == body


async def test_the_connection_cap_waits_for_or_reuses_connections(ups: list[FakeUpstream]) -> None:
    for u in ups:
        u.delay = 0.05

    async def one(client: NativeUpstream, up: FakeUpstream) -> bytes:
        resp = await client.open(endpoint(up.url, up.name), "/v1/completions", JSON)
        try:
            return await resp.read()
        finally:
            resp.release()

    async with native(max_connections=1) as client:
        bodies = await asyncio.gather(*(one(client, ups[i % 2]) for i in range(6)))
        assert client.open_connections <= 1
    assert [json.loads(b)["worker"] for b in bodies] == ["w0", "w1"] * 3


async def test_headers_are_sent_and_hostile_values_cannot_split_the_request() -> None:
    async with ScriptedUpstream(lambda conn, req: ok()) as srv, native() as client:
        resp = await client.open(
            endpoint(srv.url),
            "/v1/completions",
            JSON,
            {"Content-Type": "application/json", "X-Request-Id": "a\r\nX-Evil: 1"},
        )
        assert await resp.read() == OK
        resp.release()
        resp = await client.open(endpoint(srv.url), "/v1/completions", JSON)
        assert await resp.read() == OK
    assert srv.requests == 2 and srv.bodies == [JSON, JSON]
    assert b"X-Request-Id: a  X-Evil: 1\r\n" in srv.heads[0]
    assert srv.heads[0].startswith(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:")


async def test_a_worker_url_with_a_path_and_credentials() -> None:
    async with ScriptedUpstream(lambda conn, req: ok()) as srv, native() as client:
        url = f"http://user:s%40cret@127.0.0.1:{srv.port}/engine/"
        resp = await client.open(endpoint(url), "/v1/completions", JSON)
        assert await resp.read() == OK
    head = srv.heads[0]
    assert head.startswith(b"POST /engine/v1/completions HTTP/1.1\r\n")
    assert b"\r\nHost: 127.0.0.1:%d\r\n" % srv.port in head
    assert b"\r\nAuthorization: Basic dXNlcjpzQGNyZXQ=\r\n" in head  # user:s@cret


async def _until(predicate: Callable[[], bool]) -> None:
    while not predicate():  # noqa: ASYNC110 (state of another server)
        await asyncio.sleep(0.01)


def test_record_for_fake_upstream_is_routable() -> None:
    # the helper the end-to-end tests use points at a real URL the transport accepts
    up = FakeUpstream("w9")
    assert endpoint(record_for(up).url).record.url.startswith("http://127.0.0.1:")
