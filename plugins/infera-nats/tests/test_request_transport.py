"""The NATS request transport: router client ⇄ real nats-server ⇄ responder ⇄ a real HTTP upstream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from infera_nats.responder import Responder
from infera_nats.transport import NatsUpstream
from infera_nats.transport_connect import NatsUnreachableError

from infera_core.scheduling.types import Endpoint
from infera_core.testing.server import until
from infera_core.testing.upstream import FakeUpstream, record_for
from infera_core.transports.upstreams import UpstreamError, UpstreamReadError
from infera_core.util.nats_server import NatsServer

STREAM = json.dumps({"model": "fake-model", "stream": True}).encode()
PLAIN = json.dumps({"model": "fake-model"}).encode()


@dataclass
class Hop:
    up: FakeUpstream
    responder: Responder
    client: NatsUpstream
    endpoint: Endpoint


async def make_client(nats: NatsServer, **kw: float) -> NatsUpstream:
    opts = {"connect_timeout": 2.0, "first_byte_timeout": 5.0, "idle_timeout": 5.0, **kw}
    client = NatsUpstream(nats.url, **opts)  # type: ignore[arg-type]
    await client.start()
    return client


@pytest.fixture
async def hop(nats_server: NatsServer) -> AsyncIterator[Hop]:
    up = FakeUpstream("w0", chunks=16)
    await up.start()
    responder = Responder("w0", up.url, nats_server.url, connect_timeout=2.0)
    await responder.start()
    client = await make_client(nats_server)
    try:
        yield Hop(up, responder, client, Endpoint(record_for(up)))
    finally:
        await client.close()
        await responder.close(grace=1.0)
        await up.stop()


async def test_json_response_arrives_whole_with_status_and_headers(hop: Hop) -> None:
    resp = await hop.client.open(hop.endpoint, "/v1/chat/completions", PLAIN, {"X-Request-Id": "r-1"})
    assert resp.status == 200
    assert resp.content_type == "application/json"
    assert resp.header("CONTENT-TYPE") == "application/json"
    body = json.loads(await resp.read())
    resp.release()
    assert body["worker"] == "w0"
    assert hop.up.last_path == "/v1/chat/completions"
    assert hop.up.last_body == PLAIN


async def test_stream_arrives_in_order_and_ends(hop: Hop) -> None:
    resp = await hop.client.open(hop.endpoint, "/v1/chat/completions", STREAM)
    assert resp.status == 200 and resp.content_type.startswith("text/event-stream")
    data = b"".join([chunk async for chunk in resp])
    resp.release()
    assert data.count(b"data: ") == 17 and data.endswith(b"data: [DONE]\n\n")


async def test_error_status_and_retry_after_pass_through(hop: Hop) -> None:
    hop.up.status = 429
    resp = await hop.client.open(hop.endpoint, "/v1/chat/completions", PLAIN)
    assert resp.status == 429
    assert b"fails with 429" in await resp.read()
    resp.release()


async def test_release_mid_stream_cancels_the_engine_request(hop: Hop) -> None:
    hop.up.chunks = 1000
    hop.up.chunk_delay = 0.01
    resp = await hop.client.open(hop.endpoint, "/v1/chat/completions", STREAM)
    it = aiter(resp)
    assert (await anext(it)).startswith(b"data: ")
    assert len(hop.up.connections) == 1
    resp.release()
    await until(lambda: hop.responder.cancelled == 1 and not hop.responder.inflight, within=5)
    # the engine's connection was closed, as when an HTTP client goes away
    await until(lambda: not hop.up.connections, within=5)


async def test_first_byte_timeout_is_a_retryable_timeout_and_cancels(
    hop: Hop, nats_server: NatsServer
) -> None:
    client = await make_client(nats_server, first_byte_timeout=0.3)
    hop.up.delay = 3.0
    try:
        with pytest.raises(UpstreamError) as err:
            await client.open(hop.endpoint, "/v1/chat/completions", PLAIN)
        assert err.value.timeout
        await until(lambda: hop.responder.cancelled == 1, within=5)
    finally:
        await client.close()


async def test_no_responder_fails_at_once(hop: Hop) -> None:
    ghost = Endpoint(record_for(FakeUpstream("ghost")))
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(UpstreamError) as err:
        await hop.client.open(ghost, "/v1/chat/completions", PLAIN)
    assert "no responder" in err.value.reason and not err.value.timeout
    assert loop.time() - t0 < 2.0  # the server's no-responders status, not a timeout


async def test_engine_down_is_a_retryable_error(hop: Hop) -> None:
    await hop.up.stop()
    with pytest.raises(UpstreamError) as err:
        await hop.client.open(hop.endpoint, "/v1/chat/completions", PLAIN)
    assert "engine unreachable" in err.value.reason


async def test_engine_dying_mid_stream_is_a_read_error(hop: Hop) -> None:
    hop.up.die_after_chunks = 3
    hop.up.chunk_delay = 0.01
    resp = await hop.client.open(hop.endpoint, "/v1/chat/completions", STREAM)
    with pytest.raises(UpstreamReadError):
        async for _ in resp:
            pass
    resp.release()


async def test_large_bodies_are_split_across_messages(hop: Hop, nats_server: NatsServer) -> None:
    big = b"x" * (3 * 1024 * 1024)  # over the default 1 MB max_payload once answered
    hop.up._json = big  # the JSON answer the fake sends
    resp = await hop.client.open(hop.endpoint, "/v1/chat/completions", PLAIN)
    assert await resp.read() == big
    resp.release()


async def test_malformed_request_is_answered_and_skipped(hop: Hop, caplog: pytest.LogCaptureFixture) -> None:
    assert hop.responder.nc is not None
    nc = hop.responder.nc
    reply = await nc.request(hop.responder.subject, b"not a request", timeout=5)
    assert reply.data[:1] == b"X" and b"malformed request" in reply.data
    assert "malformed NATS request on infera.req.w0" in caplog.text
    resp = await hop.client.open(hop.endpoint, "/v1/chat/completions", PLAIN)  # still serving
    assert resp.status == 200
    resp.release()


async def test_client_started_while_nats_is_down_connects_once_it_is_up() -> None:
    """A router that made its NATS client while NATS was down (a worker on a transport it was not
    started with) gets it working once NATS is up, without a restart."""
    nats = NatsServer()  # not started yet
    client = NatsUpstream(nats.url, connect_timeout=0.5, first_byte_timeout=5.0, idle_timeout=5.0)
    up = FakeUpstream("w0")
    await up.start()
    responder: Responder | None = None
    try:
        with pytest.raises(NatsUnreachableError):
            await client.start()
        ep = Endpoint(record_for(up))
        with pytest.raises(UpstreamError, match="not connected"):
            await client.open(ep, "/v1/chat/completions", PLAIN)
        nats.start()
        responder = Responder("w0", up.url, nats.url, connect_timeout=2.0)
        await responder.start()

        async def answered() -> bool:
            try:
                resp = await client.open(ep, "/v1/chat/completions", PLAIN)
            except UpstreamError:
                await asyncio.sleep(0.1)
                return False
            resp.release()
            return resp.status == 200

        async with asyncio.timeout(10):
            while not await answered():
                pass
    finally:
        await client.close()
        if responder is not None:
            await responder.close(grace=0.5)
        await up.stop()
        nats.close()


async def test_two_responders_of_one_worker_share_its_requests(hop: Hop, nats_server: NatsServer) -> None:
    """A second responder on the same subject (an overlapping restart) joins the queue group:
    every request is answered exactly once."""
    twin = Responder("w0", hop.up.url, nats_server.url, connect_timeout=2.0)
    await twin.start()
    try:
        for _ in range(20):
            resp = await hop.client.open(hop.endpoint, "/v1/chat/completions", PLAIN)
            assert resp.status == 200
            await resp.read()
            resp.release()
        assert hop.up.requests == 20
        assert hop.responder.requests + twin.requests == 20
        assert hop.responder.requests and twin.requests
    finally:
        await twin.close(grace=0.5)


async def test_unreachable_nats_is_one_clear_error_without_credentials(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = NatsUpstream(
        "nats://alice:s3cret@127.0.0.1:1", connect_timeout=0.5, first_byte_timeout=1.0, idle_timeout=1.0
    )
    with pytest.raises(NatsUnreachableError) as err:
        await client.start()
    await client.close()
    assert "did not answer within 0.5 s" in str(err.value) and "127.0.0.1:1" in str(err.value)
    assert "s3cret" not in str(err.value) and "s3cret" not in caplog.text
    assert not [r for r in caplog.records if r.name.startswith("infera.nats")]  # the error says it all
