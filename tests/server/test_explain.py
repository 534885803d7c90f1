"""Routing explanations (``X-Infera-Explain``) and ``/v1/admin/decisions`` against real sims
with KV events: the explanation of a kv-aware decision names the worker holding the prompt's
prefix and its overlap in blocks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from infera_core.kv.component import KvRouting
from infera_core.kv.settings import KvSettings
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import eventually, serving, settings_for

sim_testing = pytest.importorskip("infera_sim.testing")
from kv_sim_rig import kv_aware_over_sims  # noqa: E402

BS = 16
MODEL = "sim-model"
PROMPT = " ".join(f"word{i}" for i in range(400))


@pytest.fixture(scope="module")
def sims() -> Iterator[list[Any]]:
    with sim_testing.start_sims(3, block_size=BS) as handles:
        yield handles


async def _warm(kv: KvRouting, client: httpx.AsyncClient, sims: list[Any]) -> None:
    """The prompt goes to sim-1 directly (not through the router): only its KV events tell."""
    r = await client.post(
        sims[1].url + "/v1/completions", json={"model": MODEL, "prompt": PROMPT, "max_tokens": 1}
    )
    assert r.status_code == 200, r.text
    assert await eventually(lambda: bool(kv.cache_view("sim-1").get("blocks")), 30), "no KV events from sim-1"


async def test_explain_names_the_worker_with_the_cached_prefix(sims: list[Any]) -> None:
    async with kv_aware_over_sims(sims) as (srv, kv), httpx.AsyncClient(timeout=30) as client:
        await _warm(kv, client, sims)
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 2}
        r = await client.post(srv.url + "/v1/completions", json=body, headers={"X-Infera-Explain": "1"})
        assert r.status_code == 200, r.text
        assert r.headers["x-infera-worker"] == "sim-1"
        explained = json.loads(r.headers["x-infera-explain"])
        assert explained["picked"] == "sim-1"
        assert explained["policy"] == "kv-aware"
        by_worker = {c["worker"]: c for c in explained["candidates"]}
        assert set(by_worker) | {e["worker"] for e in explained["excluded"]} == {
            "sim-0",
            "sim-1",
            "sim-2",
        }
        best = by_worker["sim-1"]["terms"]["kv-overlap"]
        prompt_blocks = best["prompt_blocks"]
        assert prompt_blocks >= 400 // BS
        assert best["overlap_blocks"] >= prompt_blocks - 1  # all full blocks but maybe the last
        for other in ("sim-0", "sim-2"):
            if other in by_worker:
                assert by_worker[other]["terms"]["kv-overlap"]["overlap_blocks"] == 0
                assert by_worker[other]["score"] < by_worker["sim-1"]["score"]
        assert "load" in by_worker["sim-1"]["terms"]
        assert "in_flight" in by_worker["sim-1"]["terms"]["load"]

        # a stream carries it as a trailing SSE comment, after the events
        body = {**body, "stream": True}
        r = await client.post(srv.url + "/v1/completions", json=body, headers={"X-Infera-Explain": "1"})
        assert r.status_code == 200
        assert "x-infera-explain" not in r.headers
        text = r.text
        assert text.rstrip().splitlines()[-1].startswith(": infera-explain {")
        trailing = json.loads(text.rstrip().splitlines()[-1][len(": infera-explain ") :])
        assert trailing["picked"] == "sim-1"
        assert "data: [DONE]" in text

        # without the header: nothing
        r = await client.post(srv.url + "/v1/completions", json={**body, "stream": False})
        assert "x-infera-explain" not in r.headers

        kept = (await client.get(srv.url + "/v1/admin/decisions")).json()["data"]
        assert [d["picked"] for d in kept[:2]] == ["sim-1", "sim-1"]  # the two explained, newest first
        assert kept[0]["status"] == 200 and kept[0]["candidates"]


async def test_explain_is_ignored_for_keys_that_may_not(sims: list[Any], tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(
        "keys:\n  - {name: plain, key: sk-plain}\n  - {name: curious, key: sk-curious, explain: true}\n"
    )
    hooks = make_hooks()
    settings = settings_for(router_policy="kv-aware", api_key_file=keys, admin_token="adm-secret")
    async with serving(settings, hooks, kv=KvRouting(hooks.catalog(), KvSettings())) as srv:
        srv.store.put(sims[0].record("sim-0"))
        await srv.wait_workers(1)
        body = {"model": MODEL, "prompt": "hello there", "max_tokens": 1}
        async with httpx.AsyncClient(timeout=30) as client:

            async def explained(key: str) -> bool:
                headers = {"X-Infera-Explain": "1", "Authorization": f"Bearer {key}"}
                r = await client.post(srv.url + "/v1/completions", json=body, headers=headers)
                assert r.status_code == 200, r.text
                return "x-infera-explain" in r.headers

            assert not await explained("sk-plain")
            assert await explained("sk-curious")
            assert await explained("adm-secret")  # the admin
            r = await client.get(srv.url + "/v1/admin/decisions")
            assert r.status_code == 401
            r = await client.get(
                srv.url + "/v1/admin/decisions", headers={"Authorization": "Bearer adm-secret"}
            )
            assert len(r.json()["data"]) == 2
