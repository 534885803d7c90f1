"""PD end to end with real sim processes: both protocol families, streaming and not."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from infera_core.testing.fixtures import make_hooks
from infera_core.testing.pd import SimPdFleet, sim_pd_fleet
from infera_core.testing.server import RunningServer, serving, settings_for
from infera_core.worker import Role

PROTOCOLS = ["vllm-nixl", "sglang-bootstrap"]
PROMPT = "the quick brown fox jumps over the lazy dog " * 20


@pytest.fixture(scope="module", params=PROTOCOLS)
def fleet(request: pytest.FixtureRequest) -> Iterator[SimPdFleet]:
    with sim_pd_fleet(request.param, prefill=1, decode=1) as f:
        yield f


@pytest.fixture
async def srv(fleet: SimPdFleet) -> AsyncIterator[RunningServer]:
    async with serving(settings_for(), make_hooks()) as s:
        for record in fleet.records:
            s.store.put(record)
        await s.wait_workers(len(fleet.records))
        yield s


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_non_streaming_completion_goes_through_the_pair(srv: RunningServer, fleet: SimPdFleet) -> None:
    async with httpx.AsyncClient(base_url=srv.url, timeout=20) as c:
        r = await c.post("/v1/completions", json={"model": "sim-model", "prompt": PROMPT, "max_tokens": 8})
        assert r.status_code == 200, r.text
        body = r.json()
        assert r.headers["x-infera-worker"] == "d0"
        assert len(body["choices"][0]["text"]) > 0
        assert body["usage"]["completion_tokens"] == 8
        tokenized = (await c.post(fleet.by_id("p0").handle.url + "/tokenize", json={"prompt": PROMPT})).json()
        assert body["usage"]["prompt_tokens"] == tokenized["count"]
        text = (await c.get("/metrics")).text
        assert metric(text, "infera_pd_pairs_total", prefill="p0", decode="d0") == 1


async def test_streaming_chat_goes_through_the_pair(srv: RunningServer) -> None:
    chat = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": PROMPT}],
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
        assert any('"usage"' in line and '"prompt_tokens"' in line for line in lines)
        workers = {w["worker_id"]: w for w in (await c.get("/v1/workers")).json()["data"]}
        assert workers["p0"]["picks"] == 1 and workers["d0"]["picks"] == 1
        assert workers["p0"]["role"] == str(Role.PREFILL)
