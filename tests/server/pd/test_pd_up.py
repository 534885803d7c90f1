"""``infera-run up --prefill N --decode M``: a PD fleet of sim workers behind the embedded server."""

from __future__ import annotations

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


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["vllm-nixl", "sglang-bootstrap"])
async def test_up_with_prefill_and_decode_serves_through_pairs(protocol: str) -> None:
    settings = UpSettings(prefill=1, decode=1, pd_protocol=protocol, port=0, quiet=True, drain_timeout=1)
    async with (
        Stack(settings, engine_args=["--speedup", "20"]) as stack,
        httpx.AsyncClient(base_url=stack.root, timeout=20) as c,
    ):
        workers = {w["role"]: w for w in (await c.get("/v1/workers")).json()["data"]}
        assert set(workers) == {"prefill", "decode"}
        body = {"model": "sim-model", "messages": [{"role": "user", "content": "hello " * 50}]}
        r = await c.post("/v1/chat/completions", json={**body, "max_tokens": 4})
        assert r.status_code == 200, r.text
        assert r.headers["x-infera-worker"] == workers["decode"]["worker_id"]
        pairs = [
            line
            for line in (await c.get("/metrics")).text.splitlines()
            if line.startswith("infera_pd_pairs_total{")
        ]
        assert len(pairs) == 1 and workers["prefill"]["worker_id"] in pairs[0] and pairs[0].endswith(" 1.0")
