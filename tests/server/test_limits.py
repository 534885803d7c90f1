"""Connection and request limits against hostile clients, on real sockets (issue 19, item 1)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import httpx
import pytest
from limits_rig import CHAT, closed_within, connect, response, stack, trickle

from infera_core.testing.server import RunningServer, until
from infera_core.testing.upstream import FakeUpstream, fake_upstreams


@pytest.fixture
async def ups() -> AsyncIterator[list[FakeUpstream]]:
    async with fake_upstreams(1) as out:
        yield out


async def test_never_used_and_used_connections_close_after_idle_timeout(ups: list[FakeUpstream]) -> None:
    async with stack(ups, idle_timeout=0.5) as srv:
        conns = [await connect(srv) for _ in range(200)]
        used_reader, used_writer = await connect(srv)
        body = json.dumps(CHAT).encode()
        used_writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body)
        )
        async with asyncio.timeout(5):
            await used_reader.readuntil(b"\r\n\r\n")
        results = await asyncio.gather(
            *(closed_within(r, 5.0) for r, _ in conns), closed_within(used_reader, 5.0)
        )
        assert all(results)  # 200 never used + 1 used keep-alive connection, all closed
        for _, w in [*conns, (used_reader, used_writer)]:
            w.close()


async def test_slowloris_gets_408_and_the_connection_closes(ups: list[FakeUpstream]) -> None:
    async with stack(ups, header_timeout=0.5) as srv:
        reader, writer = await connect(srv)
        request = b"GET /health HTTP/1.1\r\nhost: x\r\n" + b"x-pad: " + b"a" * 400 + b"\r\n\r\n"
        answer = asyncio.ensure_future(response(reader, within=10))
        sent = await trickle(writer, request, answer, 0.01)
        status, body, closed = await answer
        assert sent < len(request)  # never got to finish its headers
        assert status == 408 and closed
        assert body["error"]["code"] == "header_timeout"
        writer.close()


async def test_twenty_megabytes_of_headers_get_431_early(ups: list[FakeUpstream]) -> None:
    async with stack(ups) as srv:
        reader, writer = await connect(srv)
        answer = asyncio.ensure_future(response(reader))
        writer.write(b"GET /health HTTP/1.1\r\nhost: x\r\n")
        sent = 0
        with contextlib.suppress(ConnectionError):
            while sent < 20_000_000 and not answer.done():
                writer.write(b"x-pad-%d: %s\r\n" % (sent, b"a" * 8000))
                sent += 8000
                await writer.drain()
        status, body, closed = await answer
        assert status == 431 and closed
        assert body["error"]["code"] == "headers_too_large"
        assert sent < 20_000_000  # refused on the way (after ~64 KiB), not after all 20 MB
        writer.close()


async def test_header_block_just_over_the_limit_gets_431_and_under_it_passes(ups: list[FakeUpstream]) -> None:
    async with stack(ups, max_header_bytes=16384) as srv, httpx.AsyncClient(base_url=srv.url) as c:
        ok = await c.get("/health", headers={"x-pad": "a" * 15000})
        assert ok.status_code == 200
        big = await c.get("/health", headers={"x-pad": "a" * 17000})
        assert big.status_code == 431
        assert big.json()["error"]["type"] == "invalid_request_error"


async def _admitted_again(srv: RunningServer, within: float) -> None:
    """Wait until a new client is served again (the server notices closed connections soon)."""
    async with httpx.AsyncClient(base_url=srv.url) as c:

        async def admitted() -> bool:
            try:
                return (await c.get("/health")).status_code == 200
            except httpx.HTTPError:
                return False

        async with asyncio.timeout(within):
            while not await admitted():  # noqa: ASYNC110 (no event for another process's state)
                await asyncio.sleep(0.05)


async def test_connections_beyond_max_connections_get_503(ups: list[FakeUpstream]) -> None:
    async with stack(ups, max_connections=3, max_connections_per_client=3) as srv:
        held = [await connect(srv) for _ in range(3)]
        reader, writer = await connect(srv)
        status, body, closed = await response(reader)
        assert status == 503 and closed
        assert body["error"]["code"] == "too_many_connections"
        writer.close()
        _, w0 = held.pop()
        w0.close()  # the server sees it gone soon: then a new client is admitted again
        await _admitted_again(srv, within=5)
        for _, w in held:
            w.close()


async def test_idle_sockets_from_one_address_cannot_lock_out_the_others(
    ups: list[FakeUpstream], caplog: pytest.LogCaptureFixture
) -> None:
    """Issue #28 row 11: 32 idle sockets from one address against --max-connections 30: past
    the per-client bound (by default half of --max-connections) that address gets 503 and a
    log line, while a client from another address is served."""
    async with stack(ups, max_connections=30) as srv:
        host, port = srv.url.removeprefix("http://").rsplit(":", 1)
        held = [await connect(srv) for _ in range(15)]  # the bound: 30 // 2
        refused = []
        for _ in range(17):
            reader, writer = await connect(srv)
            status, body, closed = await response(reader)
            assert status == 503 and closed and body["error"]["code"] == "too_many_connections"
            assert "--max-connections-per-client" in body["error"]["message"]
            refused.append(writer)
        # another address (127.0.0.2 is loopback too on Linux) is served meanwhile
        other = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
        async with httpx.AsyncClient(base_url=f"http://{host}:{port}", transport=other) as c:
            assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200
        lines = [r.getMessage() for r in caplog.records if "--max-connections-per-client" in r.getMessage()]
        assert len(lines) == 1 and "127.0.0.1" in lines[0]  # one line, not one per refusal
        # sockets closed: the address gets its share back
        for _, w in held + [(None, w) for w in refused]:
            w.close()
        await _admitted_again(srv, within=10)


async def test_the_per_client_bound_is_a_flag(ups: list[FakeUpstream]) -> None:
    async with stack(ups, max_connections=100, max_connections_per_client=2) as srv:
        held = [await connect(srv) for _ in range(2)]
        reader, writer = await connect(srv)
        status, body, _ = await response(reader)
        assert status == 503 and "2 per client" in body["error"]["message"]
        for _, w in [*held, (reader, writer)]:
            w.close()


async def test_garbage_pipelined_behind_a_request_in_flight_gets_400_and_no_traceback(
    ups: list[FakeUpstream], caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    ups[0].delay = 0.5
    body = json.dumps(CHAT).encode()
    async with stack(ups) as srv:
        uvicorn_log = logging.getLogger("uvicorn")  # it does not propagate to the root logger
        uvicorn_log.addHandler(caplog.handler)
        reader, writer = await connect(srv)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body)
        )
        await until(lambda: ups[0].requests == 1)  # the first request is in flight
        writer.write(b"\x00\x01 not http at all\r\n\r\n")
        status, answer, closed = await response(reader)
        assert status == 400 and closed
        assert answer["error"]["code"] == "invalid_http"
        series = srv.core.metrics.requests
        await until(lambda: sum(v.value for v in series.children.values()) == 1, within=5)
        assert all(ep.in_flight == 0 for ep in srv.core.table.by_id.values())
        writer.close()
        uvicorn_log.removeHandler(caplog.handler)
    assert not [r for r in caplog.records if r.levelname == "ERROR" or r.exc_info], caplog.text


@pytest.mark.parametrize("transport", ["native", "aiohttp"])
async def test_a_large_body_is_forwarded_byte_for_byte(ups: list[FakeUpstream], transport: str) -> None:
    text = "é" * 1_500_000  # ~3 MB: read into one growing buffer, never joined or copied
    body = json.dumps({"model": "fake-model", "messages": [{"role": "user", "content": text}]}).encode()
    async with (
        stack(ups, http_client=transport) as srv,
        httpx.AsyncClient(base_url=srv.url, timeout=30) as c,
    ):
        r = await c.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 200
        assert ups[0].last_body == body
        messages = {"model": "fake-model", "max_tokens": 5, "messages": [{"role": "user", "content": text}]}
        r = await c.post("/v1/messages", json=messages)
        assert r.status_code == 200 and r.json()["type"] == "message"


async def test_pipelined_requests_are_not_read_ahead_without_bound(ups: list[FakeUpstream]) -> None:
    ups[0].delay = 1.0  # the first request stays in flight while the client pipelines
    body = json.dumps(CHAT).encode()
    one = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )
    async with stack(ups) as srv:
        _, writer = await connect(srv)
        writer.write(one)
        await until(lambda: ups[0].requests == 1)
        import gc

        from infera_core.server.protocol import InferaHttpProtocol

        protocols = [
            o for o in gc.get_objects() if isinstance(o, InferaHttpProtocol) and o.pipeline is not None
        ]
        protocol = next(p for p in protocols if not p.transport.is_closing() and p.cycle is not None)
        for _ in range(20_000):  # ~3 MB of pipelined requests
            writer.write(one)
        await asyncio.sleep(0.2)  # what the server would read ahead in the meantime
        queued = len(protocol.pipeline)
        ups[0].delay = 0.0
        writer.transport.abort()
        assert queued < 5_000  # what one read holds (uvicorn parses a read whole), not all 20,000


async def _post_head(writer: asyncio.StreamWriter, length: int) -> None:
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % length
    )
    await writer.drain()


async def test_a_body_that_stops_after_the_headers_gets_408_and_is_not_routed(
    ups: list[FakeUpstream],
) -> None:
    async with stack(ups, body_timeout=0.5) as srv:
        reader, writer = await connect(srv)
        body = json.dumps(CHAT).encode()
        await _post_head(writer, len(body))
        writer.write(body[:10])  # then nothing more
        status, answer, closed = await response(reader, within=10)
        assert status == 408 and closed
        assert answer["error"]["code"] == "body_timeout"
        assert "--body-timeout" in answer["error"]["message"]
        assert ups[0].requests == 0
        assert all(ep.in_flight == 0 and ep.picks == 0 for ep in srv.core.table.by_id.values())
        writer.close()
        # a client sending its body at once is served as before
        async with httpx.AsyncClient(base_url=srv.url) as c:
            assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200


async def test_a_body_trickled_one_byte_at_a_time_is_cut_off(ups: list[FakeUpstream]) -> None:
    """Bytes keep coming (each gap well under --body-timeout), but far under --min-body-rate."""
    async with stack(ups, body_timeout=0.6, min_body_rate=1000) as srv:
        reader, writer = await connect(srv)
        body = json.dumps(CHAT).encode()
        await _post_head(writer, len(body))
        answer = asyncio.ensure_future(response(reader, within=10))
        sent = await trickle(writer, body, answer, 0.05)
        status, err, closed = await answer
        assert sent < len(body)  # cut off before it finished
        assert status == 408 and closed
        assert err["error"]["code"] == "body_timeout" and "bytes/s" in err["error"]["message"]
        assert ups[0].requests == 0
        writer.close()


async def test_a_slow_but_steady_body_within_the_limits_is_served(ups: list[FakeUpstream]) -> None:
    async with stack(ups, body_timeout=0.5, min_body_rate=10) as srv:
        reader, writer = await connect(srv)
        body = json.dumps(CHAT).encode()
        await _post_head(writer, len(body))
        for i in range(0, len(body), 8):  # gaps under --body-timeout, rate above --min-body-rate
            writer.write(body[i : i + 8])
            await asyncio.sleep(0.05)
        async with asyncio.timeout(10):
            head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        assert ups[0].requests == 1
        writer.close()
