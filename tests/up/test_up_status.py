"""``up``'s live status line reads the router's ``/v1/workers`` and the workers' ``/metrics``
(with httpx: no aiohttp needed)."""

from __future__ import annotations

import httpx

from infera_core.bench.scrape import HITS, QUERIES
from infera_core.up.status import snapshot

WORKERS = {
    "data": [
        {"status": "active", "in_flight": 2, "picks": 10, "url": "http://w0:1/"},
        {"status": "active", "in_flight": 1, "picks": 5, "url": "http://w1:1"},
        {"status": "draining", "in_flight": 0, "picks": 3, "url": "http://w2:1"},
    ]
}


def _fleet(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/v1/workers":
        if request.headers.get("authorization") != "Bearer t":
            return httpx.Response(401)
        return httpx.Response(200, json=WORKERS)
    if request.url.host == "w2":
        raise httpx.ConnectError("gone", request=request)
    if request.url.host == "w1":
        return httpx.Response(503)
    return httpx.Response(200, text=f'{HITS}{{model_name="m"}} 30\n{QUERIES}{{model_name="m"}} 40\n')


async def test_snapshot_counts_workers_and_sums_the_cache_counters_that_answer() -> None:
    async with httpx.AsyncClient(transport=httpx.MockTransport(_fleet)) as client:
        snap = await snapshot(client, "http://router", headers={"Authorization": "Bearer t"})
    assert (snap.active, snap.draining, snap.in_flight, snap.requests) == (2, 1, 3, 18)
    assert (snap.hits, snap.queries) == (30.0, 40.0)  # w1 answered 503, w2 not at all
    assert "cache hit 75.0%" in snap.line("kv-aware").plain


async def test_snapshot_of_a_router_that_does_not_answer_is_empty() -> None:
    async with httpx.AsyncClient(transport=httpx.MockTransport(_fleet)) as client:
        snap = await snapshot(client, "http://router")  # no admin token: 401
    assert (snap.active, snap.draining, snap.requests) == (0, 0, 0)
