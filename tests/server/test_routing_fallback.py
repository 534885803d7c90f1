"""kv-aware without a routing tokenizer: routed by text prefix, and said once per model.

Real sim engines (HTTP + KV events) behind a real server; their worker records name no
tokenizer (as a real vLLM worker's does today), so the router cannot tokenize.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from infera_core.kv.component import KvRouting
from infera_core.kv.settings import KvSettings
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import RunningServer, serving, settings_for
from infera_core.worker import KvEventsInfo, WorkerRecord

pytest.importorskip("infera_sim")
from infera_sim.testing import SimHandle, start_sim

MODEL = "sim-model"


@pytest.fixture(scope="module")
def sims() -> Iterator[list[SimHandle]]:
    with start_sim(model=MODEL, speedup="inf") as a, start_sim(model=MODEL, speedup="inf") as b:
        yield [a, b]


def untokenized(sim: SimHandle, worker_id: str) -> WorkerRecord:
    """The sim's record with its KV events but without the fingerprint that names its tokenizer."""
    rec = sim.record(worker_id)
    assert rec.kv_events is not None
    kv = KvEventsInfo(**{**rec.kv_events.model_dump(), "fingerprint": None})
    return rec.model_copy(update={"kv_events": kv})


@contextlib.asynccontextmanager
async def stack(sims: list[SimHandle], policy: str) -> AsyncIterator[RunningServer]:
    hooks = make_hooks()
    kv = KvRouting(hooks.catalog(), KvSettings())
    async with serving(settings_for(router_policy=policy), hooks, kv=kv) as srv:
        for i, sim in enumerate(sims):
            srv.store.put(untokenized(sim, f"sim{i}"))
        await srv.wait_workers(len(sims))
        yield srv


def _body(group: int, turn: int, chat: bool) -> tuple[str, dict[str, Any]]:
    """Request ``turn`` of prefix group ``group``: a long shared start, a short own end."""
    start = f"group {group}: " + " ".join(f"fact-{group}-{k}" for k in range(60))
    if chat:
        return "/v1/chat/completions", {
            "model": MODEL,
            "messages": [{"role": "system", "content": start}, {"role": "user", "content": f"q{turn}"}],
            "max_tokens": 2,
        }
    return "/v1/completions", {"model": MODEL, "prompt": f"{start} question {turn}", "max_tokens": 2}


async def _groups(c: httpx.AsyncClient, groups: int, turns: int) -> dict[tuple[int, str], list[str]]:
    """Send ``turns`` requests per group, round after round (completions, then as many chats);
    the workers each (group, route) went to. With an odd number of groups, round-robin sends
    each group's requests to both of two workers."""
    out: dict[tuple[int, str], list[str]] = {}
    for turn in range(2 * turns):
        for g in range(groups):
            path, body = _body(g, turn, chat=turn >= turns)
            r = await c.post(path, json=body)
            assert r.status_code == 200, r.text
            out.setdefault((g, path), []).append(r.headers["x-infera-worker"])
    return out


async def test_kv_aware_without_a_tokenizer_routes_by_text_prefix_and_says_so_once(
    sims: list[SimHandle], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with stack(sims, "kv-aware") as srv, httpx.AsyncClient(base_url=srv.url, timeout=20) as c:
        routed = await _groups(c, groups=3, turns=4)
        # repeated long prompts follow their prefix: each group (per route) stays on one worker
        assert all(len(set(workers)) == 1 for workers in routed.values()), routed
        assert len({w for workers in routed.values() for w in workers}) == 2  # and both workers work

        # unknown models: a 404, and not a word about tokenizing
        before = len(caplog.records)
        r = await c.post("/v1/completions", json={"model": "nope", "prompt": "hi", "max_tokens": 1})
        assert r.status_code == 404
        assert not [rec for rec in caplog.records[before:] if "tokeniz" in rec.getMessage()]

        # said once per model: one log line, /v1/workers, the stats the dashboard shows, a gauge
        said = [rec for rec in caplog.records if "routes by text prefix" in rec.getMessage()]
        assert len(said) == 1 and said[0].levelno == logging.WARNING, [r.getMessage() for r in said]
        assert f"--tokenizer {MODEL}=hf:" in said[0].getMessage()
        assert not [rec for rec in caplog.records if rec.name == "infera.tokenize" and rec.levelno >= 30]
        workers = (await c.get("/v1/workers")).json()["data"]
        assert {w["routing_mode"] for w in workers} == {"text"}
        assert (await c.get("/v1/admin/stats")).json()["routing_modes"] == {MODEL: "text"}
        metrics = (await c.get("/metrics")).text
        assert f'infera_routing_mode{{mode="text",model="{MODEL}"}} 1.0' in metrics
        assert f'infera_routing_mode{{mode="tokens",model="{MODEL}"}} 0.0' in metrics
        assert f'infera_routing_tokenize_failures_total{{model="{MODEL}"}} 24.0' in metrics


async def test_round_robin_splits_the_same_groups(sims: list[SimHandle]) -> None:
    """The workload above tells the policies apart: round-robin sends each group to both."""
    async with stack(sims, "round-robin") as srv, httpx.AsyncClient(base_url=srv.url, timeout=20) as c:
        routed = await _groups(c, groups=3, turns=4)
        assert all(len(set(workers)) == 2 for workers in routed.values()), routed
        workers = (await c.get("/v1/workers")).json()["data"]
        assert {w["routing_mode"] for w in workers} == {None}  # round-robin reads no prompt


async def test_with_a_tokenizer_the_mode_is_tokens(
    sims: list[SimHandle], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    hooks = make_hooks()
    kv = KvRouting(hooks.catalog(), KvSettings())
    async with serving(settings_for(router_policy="kv-aware"), hooks, kv=kv) as srv:
        srv.store.put(sims[0].record("sim0"))  # its fingerprint names the sim tokenizer
        await srv.wait_workers(1)
        async with httpx.AsyncClient(base_url=srv.url, timeout=20) as c:
            workers = (await c.get("/v1/workers")).json()["data"]
            metrics = (await c.get("/metrics")).text
    assert [w["routing_mode"] for w in workers] == ["tokens"]
    assert f'infera_routing_mode{{mode="tokens",model="{MODEL}"}} 1.0' in metrics
    assert [r.levelno for r in caplog.records if "routes by token ids" in r.getMessage()] == [logging.INFO]
