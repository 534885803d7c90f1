"""``/v1/responses`` routed KV-aware on the chat it stands for: a Responses request whose
``instructions`` and ``input`` render to a conversation a sim already cached (through chat) goes
to that sim, with the whole prompt's blocks counted as overlap."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from infera_core.testing.server import eventually

sim_testing = pytest.importorskip("infera_sim.testing")
from kv_sim_rig import kv_aware_over_sims  # noqa: E402

BS = 16
MODEL = "sim-model"
SYSTEM = " ".join(f"rule{i}" for i in range(300))
QUESTION = " ".join(f"ask{i}" for i in range(100))


@pytest.fixture(scope="module")
def sims() -> Iterator[list[Any]]:
    with sim_testing.start_sims(3, block_size=BS) as handles:
        yield handles


async def test_a_responses_request_goes_where_its_rendered_prefix_is_cached(sims: list[Any]) -> None:
    async with kv_aware_over_sims(sims) as (srv, kv), httpx.AsyncClient(timeout=30) as client:
        chat = {
            "model": MODEL,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}],
            "max_tokens": 1,
        }
        warm = await client.post(sims[2].url + "/v1/chat/completions", json=chat)  # not through the router
        assert warm.status_code == 200, warm.text
        assert await eventually(lambda: bool(kv.cache_view("sim-2").get("blocks")), 30), "no KV events"
        body = {"model": MODEL, "instructions": SYSTEM, "input": QUESTION, "max_output_tokens": 2}
        r = await client.post(srv.url + "/v1/responses", json=body, headers={"X-Infera-Explain": "1"})
        assert r.status_code == 200, r.text
        assert r.headers["x-infera-worker"] == "sim-2"
        explained = json.loads(r.headers["x-infera-explain"])
        terms = {c["worker"]: c["terms"] for c in explained["candidates"]}["sim-2"]["kv-overlap"]
        assert terms["prompt_blocks"] >= 400 // BS
        assert terms["overlap_blocks"] >= terms["prompt_blocks"] - 1
        assert r.json()["usage"]["input_tokens_details"]["cached_tokens"] >= (terms["prompt_blocks"] - 1) * BS
