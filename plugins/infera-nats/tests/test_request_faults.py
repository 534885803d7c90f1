"""The NATS request transport behind a real router: retries, a killed responder, a NATS restart
under load, a slow consumer."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import nats
import nats.errors
import pytest
from infera_nats.responder import Responder
from infera_nats.transport import NatsUpstream
from nats.errors import NoRespondersError

from infera_core.scheduling.types import Endpoint
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import RunningServer, serving, settings_for, until
from infera_core.testing.upstream import FakeUpstream, record_for
from infera_core.transports.upstreams import UpstreamReadError
from infera_core.util.nats_server import NatsServer

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}


class NatsFleet:
    """Two fake engines, each behind its own responder, and a router reaching them over NATS
    (their records say ``request_transport: nats``, as a launcher with the flag publishes)."""

    def __init__(self, nats: NatsServer, monkeypatch: pytest.MonkeyPatch, **settings: Any) -> None:
        monkeypatch.setenv("INFERA_NATS_URL", nats.url)  # the router's --nats-url
        self.nats = nats
        self.settings = settings
        self.ups: list[FakeUpstream] = []
        self.responders: list[Responder] = []

    async def __aenter__(self) -> tuple[RunningServer, NatsFleet]:
        for i in range(2):
            up = FakeUpstream(f"w{i}", chunks=8)
            await up.start()
            self.ups.append(up)
            responder = Responder(up.name, up.url, self.nats.url, connect_timeout=2.0)
            await responder.start()
            self.responders.append(responder)
        self.cm = serving(settings_for(request_transport="nats", **self.settings), make_hooks())
        srv = await self.cm.__aenter__()
        for up, responder in zip(self.ups, self.responders, strict=True):
            srv.store.put(
                record_for(up, request_transport="nats", request_params={"subject": responder.subject})
            )
        await srv.wait_workers(2)
        return srv, self

    async def __aexit__(self, *exc: object) -> None:
        await self.cm.__aexit__(None, None, None)
        for r in self.responders:
            await r.close(grace=0.5)
        for up in self.ups:
            await up.stop()


async def test_router_serves_json_and_streams_over_nats(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with NatsFleet(nats_server, monkeypatch) as (srv, fleet), httpx.AsyncClient(base_url=srv.url) as c:
        seen = set()
        for _ in range(4):
            r = await c.post("/v1/chat/completions", json=CHAT)
            assert r.status_code == 200
            seen.add(r.headers["x-infera-worker"])
        assert seen == {"w0", "w1"}
        async with c.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
            text = (await r.aread()).decode()
        assert r.status_code == 200 and text.count("data: ") == 9 and text.endswith("data: [DONE]\n\n")
        assert sum(x.requests for x in fleet.responders) == 5


async def test_client_disconnect_cancels_the_engine_request(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with NatsFleet(nats_server, monkeypatch) as (srv, fleet), httpx.AsyncClient(base_url=srv.url) as c:
        for up in fleet.ups:
            up.chunks, up.chunk_delay = 10_000, 0.01
        async with c.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
            async for _ in r.aiter_bytes():
                break
        await until(lambda: sum(x.cancelled for x in fleet.responders) == 1, within=5)
        await until(lambda: not any(up.connections for up in fleet.ups), within=5)


async def test_request_over_max_payload_is_413_and_no_workers_fault(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 2 MB request cannot travel as one NATS message (max_payload: 1 MB by default): the
    client gets a 413 naming the limit, the workers' breakers stay closed, legit traffic flows."""
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * (2 * 1024 * 1024)}]}
    async with NatsFleet(nats_server, monkeypatch) as (srv, fleet), httpx.AsyncClient(base_url=srv.url) as c:
        for _ in range(6):  # more than the breaker threshold, on each worker
            r = await c.post("/v1/chat/completions", json=big)
            assert r.status_code == 413, r.text
            error = r.json()["error"]
            assert error["code"] == "request_too_large" and error["type"] == "invalid_request_error"
            assert "max_payload is 1,048,576 bytes" in error["message"]
        assert srv.core.breakers.opened == 0
        assert not any(ep.breaker_open for ep in srv.core.table.by_id.values())
        assert sum(x.requests for x in fleet.responders) == 0  # nothing reached a worker
        results = [await c.post("/v1/chat/completions", json=CHAT) for _ in range(4)]
        assert [r.status_code for r in results] == [200] * 4
        assert {r.headers["x-infera-worker"] for r in results} == {"w0", "w1"}


async def test_killed_responder_requests_go_to_the_other_worker(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with NatsFleet(nats_server, monkeypatch) as (srv, fleet), httpx.AsyncClient(base_url=srv.url) as c:
        dead = fleet.responders[0]
        assert dead.nc is not None
        await dead.nc.close()  # the responder is gone; its worker record is still there
        # until the server has seen that connection close it still delivers to its subscription,
        # and such a request waits out the first-byte timeout (the case a slow server shows)
        await _until_no_responders(nats_server, dead.subject)
        results = [await c.post("/v1/chat/completions", json=CHAT) for _ in range(6)]
        assert [r.status_code for r in results] == [200] * 6
        assert {r.headers["x-infera-worker"] for r in results} == {"w1"}


async def _until_no_responders(server: NatsServer, subject: str, within: float = 10.0) -> None:
    """Wait until the NATS server answers a request on ``subject`` with "no responders"."""
    probe = await nats.connect(server.url)
    try:
        async with asyncio.timeout(within):
            while True:
                try:
                    await probe.request(subject, b"", timeout=0.5)
                except NoRespondersError:
                    return
                except nats.errors.TimeoutError:
                    pass
    finally:
        await probe.close()


@pytest.mark.slow
async def test_nats_restart_under_load_fails_only_while_down(
    nats_server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    statuses: list[tuple[float, int]] = []
    stop = asyncio.Event()
    async with NatsFleet(nats_server, monkeypatch, request_max_retries=1) as (srv, _fleet):

        async def load() -> None:
            async with httpx.AsyncClient(base_url=srv.url, timeout=10) as c:
                while not stop.is_set():
                    r = await c.post("/v1/chat/completions", json=CHAT)
                    statuses.append((time.monotonic(), r.status_code))
                    if r.status_code != 200:
                        await asyncio.sleep(0.01)

        tasks = [asyncio.create_task(load()) for _ in range(4)]
        try:
            await until(lambda: len(statuses) >= 40, within=10)
            down_at = time.monotonic()
            nats_server.stop()
            await until(lambda: any(s != 200 and t > down_at for t, s in statuses), within=10)
            await asyncio.sleep(0.5)  # some time down
            up_at = time.monotonic()
            nats_server.start()

            def recovered() -> bool:
                after = [s for t, s in statuses if t > up_at]
                return len(after) >= 20 and after[-20:] == [200] * 20

            await until(recovered, within=20)
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        opened = srv.core.breakers.opened
    first_ok = min(t for t, s in statuses if t > up_at and s == 200)
    failures = [(t, s) for t, s in statuses if s != 200]
    assert all(down_at <= t <= first_ok for t, _ in failures), "a request failed while NATS was up"
    assert {s for _, s in failures} <= {502, 503, 504}
    print(
        f"NATS restart: {len(failures)} failed requests; recovered {first_ok - up_at:.2f} s after NATS was back; "
        f"{opened} breakers opened"
    )
    # NATS down is not the workers' fault: no breaker opened, so none had a cool-down to wait out
    # (recovery itself is NATS's reconnect, which a loaded machine can stretch past seconds)
    assert opened == 0


async def test_slow_consumer_fails_its_response_and_cancels_it(nats_server: NatsServer) -> None:
    up = FakeUpstream("w0", chunks=100_000)
    up.chunk_delay = 0.0005
    await up.start()
    responder = Responder("w0", up.url, nats_server.url, connect_timeout=2.0)
    await responder.start()
    # a router that holds at most 64 KiB of one response its client has not read yet
    client = NatsUpstream(
        nats_server.url, connect_timeout=2.0, first_byte_timeout=5.0, idle_timeout=5.0, max_buffered=64 * 1024
    )
    await client.start()
    ep = Endpoint(record_for(up))
    try:
        resp = await client.open(ep, "/v1/chat/completions", json.dumps({"stream": True}).encode())
        await until(lambda: responder.cancelled == 1, within=10)  # the reader never reads
        with pytest.raises(UpstreamReadError, match="slow consumer"):
            async for _ in resp:
                pass
        resp.release()
        await until(lambda: not up.connections, within=5)  # the engine's request was aborted
        resp = await client.open(ep, "/v1/chat/completions", b"{}")  # the next request is fine
        assert resp.status == 200 and json.loads(await resp.read())["worker"] == "w0"
        resp.release()
    finally:
        await client.close()
        await responder.close(grace=0.5)
        await up.stop()
