"""``infera-run up --prefill N --decode M``: a PD fleet of sim workers behind the embedded server,
over each router PD protocol: vLLM NIXL and SGLang's bootstrap, and vLLM MoRIIO's
``vllm-moriio`` (WRITE mode, concurrent legs) and ``vllm-moriio-read`` (serial)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from infera_core.up.settings import UpSettings
from infera_core.up.stack import Stack

pytest.importorskip("infera_sim")


def test_prefill_and_decode_flags_choose_the_roles() -> None:
    assert UpSettings(prefill=2, decode=2).roles() == ["prefill", "prefill", "decode", "decode"]
    assert UpSettings(prefill=1, decode=1, workers=1).roles() == ["mixed", "prefill", "decode"]
    assert UpSettings(workers=3).roles() == ["mixed"] * 3
    assert UpSettings(prefill=2, decode=2).fleet() == "2 prefill + 2 decode sim workers"


@asynccontextmanager
async def pd_pair(protocol: str) -> AsyncIterator[tuple[httpx.AsyncClient, dict[str, Any]]]:
    """``up --prefill 1 --decode 1`` over ``protocol``: a client of its router, and its two
    workers by role."""
    settings = UpSettings(prefill=1, decode=1, pd_protocol=protocol, port=0, quiet=True, drain_timeout=1)
    async with (
        Stack(settings, engine_args=["--speedup", "20"]) as stack,
        httpx.AsyncClient(base_url=stack.root, timeout=20) as c,
    ):
        workers = {w["role"]: w for w in (await c.get("/v1/workers")).json()["data"]}
        assert set(workers) == {"prefill", "decode"}
        yield c, workers


async def metric_lines(c: httpx.AsyncClient, prefix: str) -> list[str]:
    return [line for line in (await c.get("/metrics")).text.splitlines() if line.startswith(prefix)]


async def assert_one_pair(c: httpx.AsyncClient, workers: dict[str, Any]) -> None:
    """The router counted one PD pair, of these workers, and no PD failure."""
    pairs = await metric_lines(c, "infera_pd_pairs_total{")
    assert len(pairs) == 1 and workers["prefill"]["worker_id"] in pairs[0] and pairs[0].endswith(" 1.0")
    failures = await metric_lines(c, "infera_pd_failures_total{")
    assert [line for line in failures if not line.endswith(" 0.0")] == []


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["vllm-nixl", "sglang-bootstrap"])
async def test_up_with_prefill_and_decode_serves_through_pairs(protocol: str) -> None:
    async with pd_pair(protocol) as (c, workers):
        body = {"model": "sim-model", "messages": [{"role": "user", "content": "hello " * 50}]}
        r = await c.post("/v1/chat/completions", json={**body, "max_tokens": 4})
        assert r.status_code == 200, r.text
        assert r.headers["x-infera-worker"] == workers["decode"]["worker_id"]
        await assert_one_pair(c, workers)


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["vllm-moriio", "vllm-moriio-read"])
async def test_up_serves_a_stream_through_a_moriio_pair(protocol: str) -> None:
    async with pd_pair(protocol) as (c, workers):
        body = {"model": "sim-model", "prompt": "hello " * 50, "max_tokens": 4, "stream": True}
        async with c.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200, await r.aread()
            assert r.headers["x-infera-worker"] == workers["decode"]["worker_id"]
            text = "".join([chunk async for chunk in r.aiter_text()])
        assert text.rstrip().endswith("data: [DONE]")
        await assert_one_pair(c, workers)
