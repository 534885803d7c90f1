"""``pd.mode: auto`` per request: a pair or local prefill, from the predicted TTFT of each way.

The decision alone, the scheduler fed by :class:`LatencyStats` (what ``predicted-latency``
writes), and end to end on real sims (1 prefill + 1 decode + 1 slow mixed worker)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from infera_core.errors import ConfigError
from infera_core.kv.component import KvRouting
from infera_core.kv.settings import KvSettings
from infera_core.request import RequestContext
from infera_core.scheduling.explain import Decision
from infera_core.scheduling.pd import build_pd_scheduler
from infera_core.scheduling.pd_auto import Side, choose
from infera_core.scheduling.types import LatencyStats, SchedulerDeps
from infera_core.server.fleet import EndpointTable
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.pd import SimPdFleet, sim_pd_fleet
from infera_core.testing.server import eventually, serving, settings_for
from infera_core.worker import PdInfo, Role, WorkerRecord

MODEL = "fake-model"
COSTS: dict[str, Any] = {"transfer_s_per_token": 1e-6, "overhead_s": 0.005, "min_pd_tokens": 256}


def test_the_decision_keeps_short_and_cached_prompts_local() -> None:
    slow_mixed = Side("m", 4000, 0.0, 2000.0)  # 2 s locally
    fast_prefill = Side("p", 4000, 0.0, 20000.0)  # 0.2 s + transfer
    long = choose([slow_mixed], [fast_prefill], **COSTS)
    assert long.pd and long.pd_s is not None and long.local_s == 2.0 and long.pd_s < 0.25
    short = choose([Side("m", 100, 0.0, 2000.0)], [Side("p", 100, 0.0, 20000.0)], **COSTS)
    assert not short.pd and "under 256" in short.reason
    cached = choose([Side("m", 300, 0.0, 2000.0)], [fast_prefill], **COSTS)  # 3700 tokens hit on m
    assert not cached.pd and cached.local_s is not None and cached.pd_s is not None
    assert cached.local_s < cached.pd_s
    busy_prefill = choose([slow_mixed], [Side("p", 4000, 5.0, 20000.0)], **COSTS)  # 5 s queue
    assert not busy_prefill.pd and busy_prefill.reason == "local predicted faster"


def rec(wid: str, role: Role) -> WorkerRecord:
    pd = PdInfo(protocol="vllm-nixl") if role is not Role.MIXED else None
    return WorkerRecord(
        worker_id=wid, url=f"http://127.0.0.1:9/{wid}", model=MODEL, engine="vllm", role=role, pd=pd
    )


def test_the_scheduler_decides_from_latency_stats_and_explains() -> None:
    catalog = make_hooks().catalog()
    table = EndpointTable()
    for r in (rec("p", Role.PREFILL), rec("d", Role.DECODE), rec("m", Role.MIXED)):
        table.put(r)
    stats = LatencyStats()
    deps = SchedulerDeps(clock=lambda: 100.0, latency=stats)
    sched, _ = build_pd_scheduler(table, None, catalog.policies, deps, catalog.pd_transports)
    assert sched.topology(MODEL).per_request

    def ctx(n: int) -> RequestContext:
        c = RequestContext(uuid.uuid4().hex, MODEL, "/v1/completions", {}, token_ids=list(range(n)))
        c.explain = Decision()
        return c

    stats.rates["m"] = 2000.0  # the mixed worker learned slow; the prefill worker at the prior (10000)
    long = ctx(4000)
    assert sched.choose(long).pd
    shown = long.explain.as_dict()["pd"]
    assert shown["choice"] == "pd" and shown["prefill_worker"] == "p" and shown["local_worker"] == "m"
    assert shown["predicted_local_ttft_ms"] == 2000.0 and shown["predicted_pd_ttft_ms"] < 500
    assert not sched.choose(ctx(100)).pd
    stats.rates["m"] = 50000.0  # now the mixed worker is the faster one
    assert not sched.choose(ctx(4000)).pd
    forced = build_pd_scheduler(table, {"mode": "pd"}, catalog.policies, deps, catalog.pd_transports)[0]
    assert not forced.topology(MODEL).per_request
    with pytest.raises(ConfigError, match=r"pd\.auto\.min_pd_tokens"):
        build_pd_scheduler(
            table, {"auto": {"min_pd_tokens": -1}}, catalog.policies, deps, catalog.pd_transports
        )


def test_prefill_legs_teach_the_prefill_rate_and_the_transfer_cost() -> None:
    catalog = make_hooks().catalog()
    table = EndpointTable()
    for r in (rec("p", Role.PREFILL), rec("d", Role.DECODE), rec("m", Role.MIXED)):
        table.put(r)
    now = [0.0]
    deps = SchedulerDeps(clock=lambda: now[0], latency=LatencyStats())
    sched, _ = build_pd_scheduler(table, None, catalog.policies, deps, catalog.pd_transports)
    learn = sched.predictor
    assert learn.rate("p") == 10000.0 and learn.transfer_s_per_token() == 2e-6  # the priors
    for _ in range(20):  # legs of 4000 tokens taking 1 s each: 4000 tok/s; 4 ms of transfer each
        c = RequestContext(uuid.uuid4().hex, MODEL, "/v1/completions", {}, token_ids=list(range(4000)))
        pair = sched.pick_pair(c)
        now[0] += 1.0
        sched.finished(c, pair.prefill, True)
        sched.transferred(c, 0.004)
        sched.finished(c, pair.decode, True)
    assert learn.rate("p") == pytest.approx(4000) and deps.latency.rates["p"] == learn.rate("p")
    assert learn.transfer_s_per_token() == pytest.approx(1e-6)
    assert not learn.pending


# -- end to end on real sims --------------------------------------------------------------------


def words(n: int) -> str:
    tag = uuid.uuid4().hex[:8]
    return " ".join(f"{tag}w{i}" for i in range(n))


@pytest.fixture(scope="module")
def fleet() -> Iterator[SimPdFleet]:
    slow = {"m0": {"prefill_tokens_per_s": 2000}}  # the pair's prefill runs at the sim's 20000
    with sim_pd_fleet("vllm-nixl", prefill=1, decode=1, mixed=1, flags={"speedup": 1}, per_worker=slow) as f:
        yield f


@pytest.mark.slow
async def test_short_and_cached_prompts_stay_local_long_ones_go_to_the_faster_pair(fleet: SimPdFleet) -> None:
    hooks = make_hooks()
    kv = KvRouting(hooks.catalog(), KvSettings())
    async with serving(settings_for(router_policy="predicted-latency"), hooks, kv=kv) as srv:
        for record in fleet.records:
            srv.store.put(record)
        await srv.wait_workers(3)
        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as c:

            async def send(prompt: str) -> tuple[str, dict[str, Any]]:
                """Streamed (the scorer learns from first tokens); the explanation trails the events."""
                body = {"model": "sim-model", "prompt": prompt, "max_tokens": 2, "stream": True}
                async with c.stream(
                    "POST", "/v1/completions", json=body, headers={"X-Infera-Explain": "1"}
                ) as r:
                    assert r.status_code == 200
                    lines = [line async for line in r.aiter_lines()]
                explained = next(x for x in lines if x.startswith(": infera-explain "))
                return r.headers["x-infera-worker"], json.loads(explained.split(" ", 2)[2]).get("pd", {})

            worker, pd = await send(words(20))
            assert worker == "m0" and pd["choice"] == "local" and "under" in pd["reason"], pd
            # long uncached prompts go to the pair once the mixed worker's rate is learned (2000
            # tok/s: its first long prompts, or the short one, teach it) and the pair's prefill wins
            for _ in range(6):
                worker, pd = await send(words(600))
                if worker == "d0":
                    break
                assert pd["choice"] == "local", pd
            assert worker == "d0" and pd["choice"] == "pd", pd
            assert pd["predicted_pd_ttft_ms"] < pd["predicted_local_ttft_ms"]
            # a long prompt m0 holds (sent to it directly): almost nothing to prefill there → local
            cached = words(600)
            held = int(kv.cache_view("m0").get("blocks", 0))
            body = {"model": "sim-model", "prompt": cached, "max_tokens": 1}
            assert (
                await c.post(fleet.by_id("m0").handle.url + "/v1/completions", json=body)
            ).status_code == 200
            assert await eventually(lambda: int(kv.cache_view("m0").get("blocks", 0)) >= held + 30, 30)
            worker, pd = await send(cached)
            assert worker == "m0" and pd["choice"] == "local", pd
            assert pd["uncached_local"] < 256 < pd["uncached_prefill"]
            # a long uncached Responses request stays on the mixed worker: no pair serves the route
            body = {"model": "sim-model", "input": words(600), "max_output_tokens": 2}
            r = await c.post("/v1/responses", json=body)
            assert r.status_code == 200, r.text
            assert r.headers["x-infera-worker"] == "m0"
