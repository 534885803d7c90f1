"""PD legs over the NATS request transport: ``infera-run up --prefill 1 --decode 1`` with the
router reaching both workers through their responders."""

from __future__ import annotations

import httpx
import pytest

from infera_core.config.settings import compose_settings
from infera_core.plugin.hooks import InferaHooks
from infera_core.plugin.settings import backend_models
from infera_core.up.settings import UpSettings
from infera_core.up.stack import Stack

pytest.importorskip("infera_sim")


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["vllm-nixl", "sglang-bootstrap"])
async def test_pd_pairs_serve_over_nats(protocol: str) -> None:
    hooks = InferaHooks.load()
    model = compose_settings(UpSettings, backend_models(hooks.catalog()))
    settings = model(
        prefill=1,
        decode=1,
        pd_protocol=protocol,
        port=0,
        quiet=True,
        drain_timeout=1,
        request_transport="nats",
        kv_event_transport="nats",
    )
    async with (
        Stack(settings, hooks, engine_args=["--speedup", "20"]) as stack,
        httpx.AsyncClient(base_url=stack.root, timeout=20) as c,
    ):
        assert stack.discovery is not None
        records = await stack.discovery.list_workers()
        assert {r.request_transport for r in records} == {"nats"}
        workers = {w["role"]: w for w in (await c.get("/v1/workers")).json()["data"]}
        assert set(workers) == {"prefill", "decode"}
        body = {
            "model": "sim-model",
            "messages": [{"role": "user", "content": "hello " * 50}],
            "max_tokens": 4,
        }
        r = await c.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        assert r.headers["x-infera-worker"] == workers["decode"]["worker_id"]
        async with c.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as s:
            text = "".join([part async for part in s.aiter_text()])
        assert s.status_code == 200 and text.rstrip().endswith("data: [DONE]")
        pairs = [
            line
            for line in (await c.get("/metrics")).text.splitlines()
            if line.startswith("infera_pd_pairs_total{")
        ]
        assert len(pairs) == 1 and pairs[0].endswith(" 2.0")
        # a prompt over NATS's max_payload: 413, not retried on another pair, no breaker
        big = {**body, "messages": [{"role": "user", "content": "x" * (2 * 1024 * 1024)}]}
        for _ in range(4):  # more than --breaker-failures
            r = await c.post("/v1/chat/completions", json=big)
            assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large", r.text
        metrics = (await c.get("/metrics")).text
        assert 'infera_pd_failures_total{reason="prefill_too_large"} 4.0' in metrics
        assert "infera_breaker_opened_total 0.0" in metrics
