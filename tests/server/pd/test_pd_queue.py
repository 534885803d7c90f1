"""PD requests wait in the router queue too (real sim processes, both protocol orders).

One prefill and one decode sim behind ``--max-inflight-per-worker 1``: a burst of concurrent
requests finds the pair busy; they wait in the model's queue and are served in turn (before,
PD requests bypassed the queue and got 429 at once). Without the queue (``--queue-max 0``) the
same burst is refused, as before."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from infera_core.testing.pd import MODEL, SimPdFleet, metric_sum, sim_pd_fleet
from infera_core.testing.server import serving_fleet, settings_for, until

pytestmark = pytest.mark.slow  # real sim processes, both protocol orders (as the other PD flows)

BURST = 5


@pytest.fixture(scope="module", params=["vllm-nixl", "sglang-bootstrap"])
def fleet(request: pytest.FixtureRequest) -> Iterator[SimPdFleet]:
    # slow enough (20 ms a token, 4 tokens) that the burst overlaps on a loaded machine
    with sim_pd_fleet(request.param, flags={"speedup": 1, "itl_base_ms": 20.0}) as f:
        yield f


async def _burst(c: httpx.AsyncClient) -> list[int]:
    body = {"model": MODEL, "prompt": "hello there", "max_tokens": 4, "ignore_eos": True}
    return [
        r.status_code
        for r in await asyncio.gather(*(c.post("/v1/completions", json=body) for _ in range(BURST)))
    ]


async def test_a_burst_on_a_capped_pair_waits_in_the_queue_and_is_all_served(fleet: SimPdFleet) -> None:
    settings = settings_for(max_inflight_per_worker=1, first_byte_timeout=30.0)
    async with serving_fleet(*fleet.records, settings=settings) as (srv, c):
        c.timeout = httpx.Timeout(60)
        assert await _burst(c) == [200] * BURST
        text = (await c.get("/metrics")).text
        assert metric_sum(text, "infera_queue_wait_seconds_count") >= 1
        assert all(ep.in_flight == 0 for ep in srv.core.table.by_id.values())  # every slot given back


async def test_without_the_queue_the_burst_is_refused(fleet: SimPdFleet) -> None:
    settings = settings_for(max_inflight_per_worker=1, queue_max=0)
    async with serving_fleet(*fleet.records, settings=settings) as (_, c):
        c.timeout = httpx.Timeout(60)
        codes = await _burst(c)
    assert 200 in codes and 429 in codes, codes


async def test_a_clients_own_priority_never_reaches_pd_engines_that_do_not_schedule_by_it(
    fleet: SimPdFleet,
) -> None:
    """The sims run first come, first served and refuse a non-zero ``priority`` (as older vLLM
    releases did): the router removes the client's, the key file decides tiers."""
    async with serving_fleet(*fleet.records, settings=settings_for()) as (_, c):
        c.timeout = httpx.Timeout(60)
        body = {"model": MODEL, "prompt": "hello there", "max_tokens": 2, "priority": 5}
        r = await c.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text


async def test_a_client_leaving_while_its_pd_request_waits_leaves_no_slot_taken(fleet: SimPdFleet) -> None:
    settings = settings_for(max_inflight_per_worker=1, first_byte_timeout=30.0)
    async with serving_fleet(*fleet.records, settings=settings) as (srv, c):
        c.timeout = httpx.Timeout(60)
        queue = srv.core.queue
        assert queue is not None
        body = {"model": MODEL, "prompt": "hello there", "max_tokens": 4, "ignore_eos": True}
        tasks = [asyncio.ensure_future(c.post("/v1/completions", json=body)) for _ in range(3)]
        await until(lambda: sum(len(q) for q in queue.queues.values()) >= 2, within=20)
        tasks[-1].cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert [r.status_code for r in results[:-1] if isinstance(r, httpx.Response)] == [200, 200]
        await until(lambda: all(ep.in_flight == 0 for ep in srv.core.table.by_id.values()), within=10)
        assert not any(len(q) for q in queue.queues.values())
