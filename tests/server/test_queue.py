"""The router queue in process: tickets (tiers, header override, deadlines), the queue's
timeout, a client leaving while queued, sheddable headroom and the engine saturation signal."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from infera_core.errors import ConfigError
from infera_core.kv.events import BlockStored, KvEventBatch
from infera_core.kv.index import KvIndex
from infera_core.request import RequestContext
from infera_core.server.errors import ApiError
from infera_core.server.keys import ApiKey, KeySpec, Principal, read_key_file
from infera_core.server.queue import RouterQueue, ticket_for
from infera_core.testing.server import RunningServer, post_at_once, serving_upstreams, until
from infera_core.testing.upstream import FakeUpstream

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}


@contextlib.asynccontextmanager
async def routed(
    ups: list[FakeUpstream], **settings: Any
) -> AsyncIterator[tuple[RunningServer, httpx.AsyncClient]]:
    """A router with ``settings`` serving ``ups``, and a client of it patient enough to queue."""
    async with (
        serving_upstreams(ups, **settings) as srv,
        httpx.AsyncClient(base_url=srv.url, timeout=30) as c,
    ):
        yield srv, c


def _principal(**spec: Any) -> Principal:
    key = ApiKey("k")
    key.configure(KeySpec(name="k", key="sk-k", **spec), 0.0)
    return Principal("k", key)


def _depth(srv: RunningServer) -> int:
    queue = srv.core.queue
    assert queue is not None
    return sum(len(q) for q in queue.queues.values())


def test_ticket_tier_weight_and_deadline_from_the_key_and_headers() -> None:
    t = ticket_for(_principal(priority="critical", weight=2, ttft_deadline_ms=500), {})
    assert (t.key, t.tier, t.weight, t.deadline_ms) == ("k", 1, 2.0, 500)
    # the header is ignored unless the key allows it, and never raises the key's tier
    assert ticket_for(_principal(), {"x-infera-priority": "critical"}).tier == 0
    allowed = _principal(priority="standard", allow_priority_header=True)
    assert ticket_for(allowed, {"x-infera-priority": "critical"}).tier == 0
    assert ticket_for(allowed, {"x-infera-priority": "sheddable"}).tier == -1
    # a request's deadline may only tighten the key's
    assert ticket_for(_principal(ttft_deadline_ms=500), {"x-infera-deadline-ms": "2000"}).deadline_ms == 500
    assert ticket_for(None, {"x-infera-deadline-ms": "250"}).deadline_ms == 250
    for bad in (
        {"x-infera-priority": "urgent"},
        {"x-infera-deadline-ms": "-1"},
        {"x-infera-deadline-ms": "nan"},
    ):
        with pytest.raises(ApiError) as err:
            ticket_for(allowed, bad)
        assert err.value.status == 400


def test_a_bad_priority_in_the_key_file_is_one_clear_line(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(yaml.safe_dump({"keys": [{"name": "a", "key": "sk-a", "priority": "urgent"}]}))
    with pytest.raises(ConfigError, match=r"keys\.0\.priority: .*critical, standard, sheddable"):
        read_key_file(path)
    path.write_text(yaml.safe_dump({"keys": [{"name": "a", "key": "sk-a", "priority": 7, "weight": 3}]}))
    assert read_key_file(path).keys[0].priority == 7


async def test_a_request_that_waits_past_queue_timeout_gets_503_with_retry_after(
    ups: list[FakeUpstream],
) -> None:
    async with routed(ups, max_inflight_per_worker=1, queue_timeout=0.3) as (srv, c):
        for u in ups:
            u.delay = 2.0
        results = await post_at_once(c, "/v1/chat/completions", CHAT, 3)
        assert [r.status_code for r in results] == [200, 200, 503]
        late = results[-1]
        assert late.json()["error"]["code"] == "queue_timeout" and late.headers["retry-after"]
        assert _depth(srv) == 0


async def test_a_client_leaving_while_queued_leaves_the_queue(ups: list[FakeUpstream]) -> None:
    async with routed(ups[:1], max_inflight_per_worker=1) as (srv, c):
        ups[0].delay = 0.5
        running = asyncio.ensure_future(c.post("/v1/chat/completions", json=CHAT))
        await until(lambda: srv.core.table.by_id["w0"].in_flight == 1)
        leaving = asyncio.ensure_future(c.post("/v1/chat/completions", json=CHAT))
        await until(lambda: _depth(srv) == 1)
        leaving.cancel()
        await until(lambda: _depth(srv) == 0)
        assert (await running).status_code == 200
        await until(lambda: srv.core.table.by_id["w0"].in_flight == 0)
        assert ups[0].requests == 1  # the one that left never reached the worker


async def test_sheddable_requests_leave_headroom_for_critical_ones(
    ups: list[FakeUpstream], tmp_path: Path
) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(
        yaml.safe_dump(
            {
                "keys": [
                    {"name": "bulk", "key": "sk-bulk", "priority": "sheddable"},
                    {"name": "vip", "key": "sk-vip", "priority": "critical"},
                ]
            }
        )
    )
    async with routed(ups[:1], max_inflight_per_worker=2, queue_headroom=1, api_key_file=keys) as (srv, c):
        ups[0].delay = 0.5
        bulk = {"Authorization": "Bearer sk-bulk"}
        first = asyncio.ensure_future(c.post("/v1/chat/completions", json=CHAT, headers=bulk))
        second = asyncio.ensure_future(c.post("/v1/chat/completions", json=CHAT, headers=bulk))
        await until(lambda: _depth(srv) == 1)  # one runs, one waits: the last slot is kept
        assert srv.core.table.by_id["w0"].in_flight == 1
        vip = await c.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer sk-vip"})
        assert vip.status_code == 200
        assert not second.done()  # the critical request went straight to the kept slot
        assert [r.status_code for r in await asyncio.gather(first, second)] == [200, 200]


async def test_engine_numbers_over_a_threshold_queue_requests_until_they_drop(
    ups: list[FakeUpstream],
) -> None:
    async with routed(ups, queue_engine_waiting=4, queue_engine_kv_usage=0.9) as (srv, c):
        eps = list(srv.core.table.by_id.values())
        eps[0].stats = {"waiting": 4.0}
        eps[1].stats = {"waiting": 0.0, "kv_usage": 0.95}
        queued = asyncio.ensure_future(c.post("/v1/chat/completions", json=CHAT))
        await until(lambda: _depth(srv) == 1)
        assert sum(u.requests for u in ups) == 0
        eps[1].stats = {"waiting": 0.0, "kv_usage": 0.5}  # as the next scrape would find it
        r = await queued
        assert r.status_code == 200 and r.json()["worker"] == "w1"


def test_the_cost_takes_off_the_prompt_the_kv_index_holds() -> None:
    index = KvIndex()
    view = index.add_view("w0", None, 16)
    cached = list(range(100, 164))  # 4 blocks of 16
    index.apply(view, KvEventBatch(0.0, [BlockStored([1, 2, 3, 4], None, cached, 16)]))
    queue = RouterQueue(
        lambda ctx, limited: None, lambda ctx, ep: None, max_len=8, timeout=1.0, kv_index=index
    )  # type: ignore[arg-type, return-value]
    body = {"model": "m", "prompt": "x", "max_tokens": 10}
    hit = RequestContext("r1", "m", "/v1/completions", body, token_ids=cached + list(range(500, 532)))
    miss = RequestContext("r2", "m", "/v1/completions", body, token_ids=list(range(900, 996)))
    assert queue._cost(hit) == 96 - 64 + 10
    assert queue._cost(miss) == 96 + 10


async def test_a_flooding_key_leaves_the_headroom_to_a_light_key(
    ups: list[FakeUpstream], tmp_path: Path
) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump({"keys": [{"name": "a", "key": "sk-a"}, {"name": "b", "key": "sk-b"}]}))
    async with routed(ups[:1], max_inflight_per_worker=4, queue_headroom=1, api_key_file=keys) as (srv, c):
        ups[0].delay = 3.0
        ep = srv.core.table.by_id["w0"]
        a, b = {"Authorization": "Bearer sk-a"}, {"Authorization": "Bearer sk-b"}
        b1 = asyncio.ensure_future(c.post("/v1/chat/completions", json=CHAT, headers=b))
        await until(lambda: ep.in_flight == 1)
        flood = [
            asyncio.ensure_future(c.post("/v1/chat/completions", json=CHAT, headers=a)) for _ in range(5)
        ]
        # a holds its share (half of 4 slots): it leaves the last slot free and waits
        await until(lambda: _depth(srv) == 3 and ep.in_flight == 3)
        b2 = asyncio.ensure_future(c.post("/v1/chat/completions", json=CHAT, headers=b))
        await until(lambda: ups[0].requests == 4)  # b's second request went straight to the free slot
        assert _depth(srv) == 3
        assert all(r.status_code == 200 for r in await asyncio.gather(b1, b2, *flood))


async def test_the_tier_guard_keeps_sheddable_requests_off_a_critical_requests_worker(
    ups: list[FakeUpstream], tmp_path: Path
) -> None:
    """``--queue-tier-window``: with a critical request in flight, a sheddable flood keeps to
    the other worker (half of two, at most its cap) and waits for it rather than share the
    critical one's; the next critical request goes to the worker free of sheddable ones."""
    keys = tmp_path / "keys.yaml"
    specs = [{"name": "bulk", "key": "sk-bulk", "priority": "sheddable"}]
    keys.write_text(
        yaml.safe_dump({"keys": [*specs, {"name": "vip", "key": "sk-vip", "priority": "critical"}]})
    )
    settings = {"max_inflight_per_worker": 4, "queue_tier_window": 60.0, "api_key_file": keys}
    async with routed(ups, **settings) as (srv, c):
        for u in ups:
            u.delay = 1.0
        eps = srv.core.table.by_id
        vip, bulk = {"Authorization": "Bearer sk-vip"}, {"Authorization": "Bearer sk-bulk"}
        first = asyncio.ensure_future(c.post("/v1/chat/completions", json=CHAT, headers=vip))
        await until(lambda: sum(ep.in_flight for ep in eps.values()) == 1)
        quiet = next(w for w, ep in eps.items() if ep.in_flight == 1)
        busy = next(w for w in eps if w != quiet)
        flood = [
            asyncio.ensure_future(c.post("/v1/chat/completions", json=CHAT, headers=bulk)) for _ in range(6)
        ]
        await until(lambda: _depth(srv) == 2)
        assert (eps[quiet].in_flight, eps[busy].in_flight) == (1, 4)
        second = await c.post("/v1/chat/completions", json=CHAT, headers=vip)
        assert second.status_code == 200 and second.json()["worker"] == quiet
        done = await asyncio.gather(first, *flood)
        assert [r.status_code for r in done] == [200] * 7
        assert {r.json()["worker"] for r in done[1:]} == {busy}
