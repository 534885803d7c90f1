"""vLLM MoRIIO's router protocols end to end: ``infera-run up --prefill 1 --decode 1`` with sim
workers speaking ``vllm-moriio`` (WRITE mode, concurrent legs) and ``vllm-moriio-read`` (serial)."""

from __future__ import annotations

import httpx
import pytest

from infera_core.up.settings import UpSettings
from infera_core.up.stack import Stack

pytest.importorskip("infera_sim")


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["vllm-moriio", "vllm-moriio-read"])
async def test_up_serves_through_a_moriio_pair(protocol: str) -> None:
    settings = UpSettings(prefill=1, decode=1, pd_protocol=protocol, port=0, quiet=True, drain_timeout=1)
    async with (
        Stack(settings, engine_args=["--speedup", "20"]) as stack,
        httpx.AsyncClient(base_url=stack.root, timeout=20) as c,
    ):
        workers = {w["role"]: w for w in (await c.get("/v1/workers")).json()["data"]}
        body = {"model": "sim-model", "prompt": "hello " * 50, "max_tokens": 4, "stream": True}
        async with c.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200, await r.aread()
            assert r.headers["x-infera-worker"] == workers["decode"]["worker_id"]
            text = "".join([chunk async for chunk in r.aiter_text()])
        assert text.rstrip().endswith("data: [DONE]")
        pairs = [
            line
            for line in (await c.get("/metrics")).text.splitlines()
            if line.startswith("infera_pd_pairs_total{")
        ]
        assert len(pairs) == 1 and workers["prefill"]["worker_id"] in pairs[0] and pairs[0].endswith(" 1.0")
        failures = [
            line
            for line in (await c.get("/metrics")).text.splitlines()
            if line.startswith("infera_pd_failures_total{") and not line.endswith(" 0.0")
        ]
        assert failures == []
