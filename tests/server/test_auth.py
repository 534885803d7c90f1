"""The admin surface: --admin-token, loopback-only without one, redacted worker URLs, direct mode."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import RunningServer, serving, settings_for
from infera_core.testing.upstream import FakeUpstream, fake_upstreams, record_for
from infera_core.util.net import free_port
from infera_core.util.redact import redact_url
from infera_core.worker import Status, WorkerRecord

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
ADMIN_ROUTES = ["/v1/workers", "/v1/admin/usage", "/v1/admin/cache-view/w0", "/metrics"]


def _lan_address() -> str | None:
    """A non-loopback address of this machine (None when there is none)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent for UDP connect
            addr = str(s.getsockname()[0])
        except OSError:
            return None
    return None if addr.startswith("127.") or addr == "0.0.0.0" else addr


@pytest.fixture
async def ups() -> AsyncIterator[list[FakeUpstream]]:
    async with fake_upstreams(2) as out:
        yield out


@pytest.fixture
def anyhost() -> dict[str, Any]:
    return {"host": "0.0.0.0", "port": free_port()}


@contextlib.asynccontextmanager
async def running(ups: list[FakeUpstream], **settings: Any) -> AsyncIterator[RunningServer]:
    async with serving(settings_for(**settings), make_hooks()) as srv:
        for u in ups:
            srv.store.put(record_for(u))
        await srv.wait_workers(len(ups))
        yield srv


async def test_without_admin_token_admin_routes_answer_loopback_only(
    ups: list[FakeUpstream], anyhost: dict[str, Any]
) -> None:
    lan = _lan_address()
    if lan is None:
        pytest.skip("no non-loopback address on this machine")
    port = anyhost["port"]
    async with running(ups, **anyhost):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as local:
            for route in ADMIN_ROUTES:
                assert (await local.get(route)).status_code in (200, 404), route  # 404: no KV view/keys
            assert (await local.get("/v1/workers")).json()["data"]
        async with httpx.AsyncClient(base_url=f"http://{lan}:{port}") as remote:
            for route in ADMIN_ROUTES:
                r = await remote.get(route)
                assert r.status_code == 403, route
                assert (
                    r.json()["error"]["code"] == "admin_only"
                    and "--admin-token" in r.json()["error"]["message"]
                )
            # the public surface stays public
            assert (await remote.get("/health")).status_code == 200
            assert (await remote.get("/v1/models")).status_code == 200
            assert (await remote.post("/v1/chat/completions", json=CHAT)).status_code == 200


async def test_admin_token_gates_workers_admin_and_metrics(ups: list[FakeUpstream]) -> None:
    async with running(ups, admin_token="s3cret-admin") as srv, httpx.AsyncClient(base_url=srv.url) as c:
        for route in ADMIN_ROUTES:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-admin"}):
                r = await c.get(route, headers=headers)
                assert r.status_code == 401, (route, headers)
                assert r.json()["error"]["code"] == "invalid_admin_token"
                assert r.headers["www-authenticate"].startswith("Bearer")
        ok = {"Authorization": "Bearer s3cret-admin"}
        assert (await c.get("/v1/workers", headers=ok)).status_code == 200
        assert "infera_requests" in (await c.get("/metrics", headers=ok)).text
        assert (await c.get("/health")).status_code == 200


async def test_public_metrics_opens_metrics_only(ups: list[FakeUpstream]) -> None:
    async with (
        running(ups, admin_token="tok", public_metrics=True) as srv,
        httpx.AsyncClient(base_url=srv.url) as c,
    ):
        assert (await c.get("/metrics")).status_code == 200
        assert (await c.get("/v1/workers")).status_code == 401


def test_redact_url_masks_credentials_and_query_values() -> None:
    assert redact_url("http://admin:hunter2@10.0.0.5:8000") == "http://***@10.0.0.5:8000"
    assert redact_url("http://10.0.0.5:8000/v1?token=abc&x") == "http://10.0.0.5:8000/v1?token=***&***"
    assert redact_url("http://10.0.0.5:8000") == "http://10.0.0.5:8000"
    assert redact_url("admin:hunter2@host:80") == "***@host:80"


SECRET_URLS = {
    "http://127.0.0.1:{port}/#access_token=frag-s3cret": "http://127.0.0.1:{port}/#access_token=***",
    "http://127.0.0.1:{port}/#frag-s3cret": "http://127.0.0.1:{port}/#***",
    "http://127.0.0.1:{port}/?bare-s3cret": "http://127.0.0.1:{port}/?***",
    "http://127.0.0.1:{port}/v1;jsessionid=sess-s3cret": "http://127.0.0.1:{port}/v1;jsessionid=***",
    "http://127.0.0.1:{port}/a;b=x-s3cret;c/?t=q-s3cret;u=v-s3cret": "http://127.0.0.1:{port}/a;b=***;***/?t=***&u=***",
}


def test_redact_url_masks_fragments_bare_query_items_and_path_parameters() -> None:
    for url, shown in SECRET_URLS.items():
        assert redact_url(url.format(port=80)) == shown.format(port=80)


async def test_workers_and_admin_stats_never_show_url_secrets() -> None:
    """Issue #28 row 13: a fragment, a bare query token and ``;jsessionid=`` are redacted."""
    dead = free_port()
    async with running([]) as srv:
        for i, url in enumerate(SECRET_URLS):
            rec = WorkerRecord(
                worker_id=f"w{i}", url=url.format(port=dead), model="fake-model", engine="fake"
            )
            srv.store.put(rec)
        await srv.wait_workers(len(SECRET_URLS))
        async with httpx.AsyncClient(base_url=srv.url) as c:
            for route in ("/v1/workers", "/v1/admin/stats"):
                r = await c.get(route)
                assert r.status_code == 200, route
                assert "s3cret" not in r.text, (route, r.text)
            shown = {w["url"] for w in (await c.get("/v1/workers")).json()["data"]}
            assert shown == {v.format(port=dead) for v in SECRET_URLS.values()}


async def test_worker_credentials_never_shown_or_logged(caplog: pytest.LogCaptureFixture) -> None:
    dead = free_port()
    async with running([]) as srv:
        secret_url = f"http://admin:hunter2@127.0.0.1:{dead}"
        srv.store.put(WorkerRecord(worker_id="w-secret", url=secret_url, model="fake-model", engine="fake"))
        await srv.wait_workers(1)
        async with httpx.AsyncClient(base_url=srv.url) as c:
            shown = (await c.get("/v1/workers")).text
            assert "hunter2" not in shown and "admin:" not in shown
            assert f"***@127.0.0.1:{dead}" in shown
            with caplog.at_level(logging.DEBUG):
                r = await c.post("/v1/chat/completions", json=CHAT)
        assert r.status_code in (502, 503)
        assert "hunter2" not in r.text
        logged = "\n".join(rec.getMessage() for rec in caplog.records)
        assert "w-secret" in logged and "hunter2" not in logged


async def test_direct_mode_needs_the_admin_token(ups: list[FakeUpstream]) -> None:
    async with (
        running(ups, router_mode="direct", admin_token="tok") as srv,
        httpx.AsyncClient(base_url=srv.url) as c,
    ):
        r = await c.post("/v1/chat/completions", json=CHAT, headers={"x-worker-instance-id": "w1"})
        assert r.status_code == 401 and "x-worker-instance-id" in r.json()["error"]["message"]
        ok = {"x-worker-instance-id": "w1", "Authorization": "Bearer tok"}
        for _ in range(3):
            assert (await c.post("/v1/chat/completions", json=CHAT, headers=ok)).json()["worker"] == "w1"
        # without the header, no token is needed (the policy routes)
        assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200


async def test_direct_mode_respects_health_and_the_in_flight_cap(ups: list[FakeUpstream]) -> None:
    w0, w1 = ups
    async with (
        running(ups, router_mode="direct", max_inflight_per_worker=1) as srv,
        httpx.AsyncClient(base_url=srv.url) as c,
    ):
        to_w1 = {"x-worker-instance-id": "w1"}
        # w1 at its cap: a direct request for it goes to w0 instead of stacking on w1
        w1.delay = 1.0
        busy = asyncio.ensure_future(c.post("/v1/chat/completions", json=CHAT, headers=to_w1))
        table = srv.core.table
        async with asyncio.timeout(5):
            while table.by_id["w1"].in_flight < 1:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        r = await c.post("/v1/chat/completions", json=CHAT, headers=to_w1)
        assert r.status_code == 200 and r.json()["worker"] == "w0"
        assert (await busy).json()["worker"] == "w1"
        w1.delay = 0.0
        # w1 draining: direct requests for it go elsewhere
        srv.store.put(record_for(w1, status=Status.DRAINING))
        async with asyncio.timeout(5):
            while table.by_id["w1"].record.status is not Status.DRAINING:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        for _ in range(3):
            r = await c.post("/v1/chat/completions", json=CHAT, headers=to_w1)
            assert r.json()["worker"] == w0.name
