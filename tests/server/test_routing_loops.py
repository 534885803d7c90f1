"""A worker record whose URL is the router itself (issue #28 row 8): the loop is seen at the
first hop (the router's own ``Via`` stamp comes back), the worker leaves rotation with one
log line, and the client gets an OpenAI-shaped 508 — or its answer from a real worker."""

from __future__ import annotations

import logging

import httpx
import pytest

from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import serving, serving_one_scripted, settings_for
from infera_core.testing.upstream import fake_upstreams, http_reply, record_for
from infera_core.worker import WorkerRecord

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}


def _loop_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "routing loop" in r.getMessage()]


async def test_a_record_pointing_at_the_router_is_a_508_at_the_first_hop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = settings_for(first_byte_timeout=5.0, stream_idle_timeout=5.0, upstream_connections=64)
    async with serving(settings, make_hooks()) as srv, httpx.AsyncClient(base_url=srv.url, timeout=30) as c:
        srv.store.put(WorkerRecord(worker_id="w-loop", url=srv.url, model="fake-model", engine="fake"))
        await srv.wait_workers(1)
        with caplog.at_level(logging.INFO):
            r = await c.post("/v1/chat/completions", json=CHAT)
            assert r.status_code == 508, r.text
            err = r.json()["error"]
            assert err["code"] == "loop_detected" and "w-loop" in err["message"]
            # two requests in all: the client's and the one that came back (no nesting)
            metrics = (await c.get("/metrics")).text
            served = [line for line in metrics.splitlines() if line.startswith("infera_requests_total{")]
            assert sum(float(line.rsplit(" ", 1)[1]) for line in served) == 2, served
            # the worker is out of rotation: the next request is not routed to it
            assert (await c.get("/v1/workers")).json()["data"][0]["breaker"] == "open"
            again = await c.post("/v1/chat/completions", json=CHAT)
            assert again.status_code == 503 and again.json()["error"]["code"] == "no_worker_available"
        assert len(_loop_lines(caplog)) == 1, _loop_lines(caplog)
        assert "w-loop" in _loop_lines(caplog)[0]


async def test_with_a_real_worker_beside_the_loop_every_request_is_served(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with (
        fake_upstreams(1) as [up],
        serving(settings_for(first_byte_timeout=5.0), make_hooks()) as srv,
        httpx.AsyncClient(base_url=srv.url, timeout=30) as c,
    ):
        srv.store.put(WorkerRecord(worker_id="w-loop", url=srv.url, model="fake-model", engine="fake"))
        srv.store.put(record_for(up))
        await srv.wait_workers(2)
        with caplog.at_level(logging.INFO):
            for _ in range(6):
                r = await c.post("/v1/chat/completions", json=CHAT)
                assert r.status_code == 200, r.text
        assert len(_loop_lines(caplog)) == 1


async def test_a_client_via_header_is_kept_and_stamped() -> None:
    """A ``Via`` the client (or a proxy in front) sent reaches the worker, this router after it;
    a request stamped by another router passes (router → router is a legitimate tier)."""
    answer = b'{"choices":[]}'
    reply = http_reply(200, answer)
    async with serving_one_scripted(reply) as (engine, srv, c):
        mine = srv.core.router_id
        assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200
        assert f"\r\nVia: 1.1 {mine}\r\n".encode() in engine.heads[-1]
        for theirs in ("1.1 edge-proxy", "1.1 infera-0000other"):
            r = await c.post("/v1/chat/completions", json=CHAT, headers={"Via": theirs})
            assert r.status_code == 200
            assert f"\r\nVia: {theirs}, 1.1 {mine}\r\n".encode() in engine.heads[-1]


async def test_tokenize_through_a_looping_record_is_one_hop_too(caplog: pytest.LogCaptureFixture) -> None:
    async with (
        serving(settings_for(first_byte_timeout=5.0), make_hooks()) as srv,
        httpx.AsyncClient(base_url=srv.url, timeout=30) as c,
    ):
        srv.store.put(WorkerRecord(worker_id="w-loop", url=srv.url, model="fake-model", engine="fake"))
        await srv.wait_workers(1)
        with caplog.at_level(logging.INFO):
            r = await c.post("/tokenize", json={"model": "fake-model", "prompt": "hi"})
        assert r.status_code == 502 and "routing loop" in r.json()["error"]["message"]
        assert len(_loop_lines(caplog)) == 1
        assert (await c.get("/v1/workers")).json()["data"][0]["breaker"] == "open"


@pytest.mark.slow
async def test_a_pd_leg_to_a_looping_record_is_one_hop_and_the_pair_is_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from infera_core.testing.pd import sim_pd_fleet

    pytest.importorskip("infera_sim")
    with sim_pd_fleet("vllm-nixl", prefill=1, decode=1) as fleet:
        async with (
            serving(settings_for(first_byte_timeout=10.0), make_hooks()) as srv,
            httpx.AsyncClient(base_url=srv.url, timeout=30) as c,
        ):
            for record in fleet.records:
                srv.store.put(record)
            [p0] = [r for r in fleet.records if r.worker_id == "p0"]
            srv.store.put(p0.model_copy(update={"worker_id": "p-loop", "url": srv.url}))
            await srv.wait_workers(len(fleet.records) + 1)
            with caplog.at_level(logging.INFO):
                for _ in range(6):
                    body = {"model": p0.model, "prompt": "a b c d e f g h", "max_tokens": 2}
                    r = await c.post("/v1/completions", json=body)
                    assert r.status_code == 200, r.text
            workers = {w["worker_id"]: w for w in (await c.get("/v1/workers")).json()["data"]}
            assert workers["p-loop"]["breaker"] == "open" and workers["p0"]["breaker"] == "closed"
        assert len(_loop_lines(caplog)) == 1
