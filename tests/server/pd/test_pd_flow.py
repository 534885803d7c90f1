"""PD end to end with real sim processes (2 prefill + 1 decode, KV routing on), both protocol families."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from infera_core.kv.component import KvRouting
from infera_core.kv.settings import KvSettings
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.pd import SimPdFleet, sim_pd_fleet
from infera_core.testing.pd import metric_sum as metric
from infera_core.testing.server import RunningServer, serving, settings_for, until
from infera_core.worker import Role

pytestmark = pytest.mark.slow

PROTOCOLS = ["vllm-nixl", "sglang-bootstrap"]


def prompt(n_words: int = 160) -> str:
    tag = uuid.uuid4().hex[:8]
    return " ".join(f"{tag}w{i}" for i in range(n_words))


@pytest.fixture(scope="module", params=PROTOCOLS)
def fleet(request: pytest.FixtureRequest) -> Iterator[SimPdFleet]:
    with sim_pd_fleet(request.param, prefill=2, decode=1) as f:
        yield f


@pytest.fixture
async def srv(fleet: SimPdFleet) -> AsyncIterator[RunningServer]:
    hooks = make_hooks()
    kv = KvRouting(hooks.catalog(), KvSettings())
    async with serving(settings_for(), hooks, kv=kv) as s:
        for record in fleet.records:
            s.store.put(record)
        await s.wait_workers(len(fleet.records))
        s.kv = kv  # type: ignore[attr-defined]
        yield s


async def prefill_counts(c: httpx.AsyncClient) -> dict[str, float]:
    text = (await c.get("/metrics")).text
    return {p: metric(text, "infera_pd_pairs_total", prefill=p) for p in ("p0", "p1")}


async def test_non_streaming_completion_goes_through_a_pair(srv: RunningServer, fleet: SimPdFleet) -> None:
    text = prompt()
    async with httpx.AsyncClient(base_url=srv.url, timeout=20) as c:
        r = await c.post("/v1/completions", json={"model": "sim-model", "prompt": text, "max_tokens": 8})
        assert r.status_code == 200, r.text
        body = r.json()
        assert r.headers["x-infera-worker"] == "d0"
        assert body["choices"][0]["text"]
        assert body["usage"]["completion_tokens"] == 8
        tokenized = (await c.post(fleet.by_id("p0").handle.url + "/tokenize", json={"prompt": text})).json()
        assert body["usage"]["prompt_tokens"] == tokenized["count"]  # the whole prompt, not 1 token
        assert sum((await prefill_counts(c)).values()) == 1


async def test_streaming_chat_goes_through_a_pair(srv: RunningServer) -> None:
    chat = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": prompt()}],
        "max_tokens": 6,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with httpx.AsyncClient(base_url=srv.url, timeout=20) as c:
        async with c.stream("POST", "/v1/chat/completions", json=chat) as r:
            assert r.status_code == 200
            assert r.headers["x-infera-worker"] == "d0"
            lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        assert sum('"content"' in line for line in lines) >= 6
        assert any('"prompt_tokens"' in line for line in lines)
        workers = {w["worker_id"]: w for w in (await c.get("/v1/workers")).json()["data"]}
        assert workers["d0"]["picks"] == 1 and workers["p0"]["picks"] + workers["p1"]["picks"] == 1
        assert workers["p0"]["role"] == str(Role.PREFILL)
        text = (await c.get("/metrics")).text
        assert metric(text, "infera_pd_phase_seconds_count", phase="prefill") == 1
        assert metric(text, "infera_pd_role_workers", role="prefill") == 2


async def test_decode_worker_ends_up_with_the_prefix_cached(srv: RunningServer, fleet: SimPdFleet) -> None:
    async with httpx.AsyncClient(timeout=20) as c:

        async def cached(worker: str) -> set[int]:
            data = (await c.get(fleet.by_id(worker).handle.url + "/sim/cache")).json()
            return set(data["block_hashes"])

        before = {w: await cached(w) for w in ("p0", "p1", "d0")}
        body = {"model": "sim-model", "prompt": prompt(200), "max_tokens": 4}
        r = await c.post(srv.url + "/v1/completions", json=body)
        assert r.status_code == 200, r.text
        new_on_prefill = set().union(*[await cached(p) - before[p] for p in ("p0", "p1")])
        new_on_decode = await cached("d0") - before["d0"]
        assert len(new_on_prefill) >= r.json()["usage"]["prompt_tokens"] // 16 - 1
        assert new_on_prefill <= new_on_decode  # the blocks the prefill computed arrived on decode


async def test_repeated_prefix_goes_to_the_prefill_worker_that_holds_it(srv: RunningServer) -> None:
    kv: KvRouting = srv.kv  # type: ignore[attr-defined]
    shared = prompt(240)
    async with httpx.AsyncClient(base_url=srv.url, timeout=20) as c:
        r = await c.post("/v1/completions", json={"model": "sim-model", "prompt": shared, "max_tokens": 2})
        assert r.status_code == 200
        first = {p for p, n in (await prefill_counts(c)).items() if n}
        assert len(first) == 1
        holder = first.pop()
        await until(lambda: any(v.block_count() >= 10 for v in kv.index.views_of(holder)), within=5)
        for i in range(4):
            body = {"model": "sim-model", "prompt": f"{shared} follow-up {i}", "max_tokens": 2}
            assert (await c.post("/v1/completions", json=body)).status_code == 200
        counts = await prefill_counts(c)
        assert counts[holder] == 5, counts


async def test_responses_on_a_pd_model_is_a_clear_error(srv: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=srv.url, timeout=20) as c:
        r = await c.post("/v1/responses", json={"model": "sim-model", "input": "hi", "max_output_tokens": 2})
    assert r.status_code == 501, r.text
    error = r.json()["error"]
    assert error["code"] == "unsupported_with_pd" and "/v1/chat/completions" in error["message"]
