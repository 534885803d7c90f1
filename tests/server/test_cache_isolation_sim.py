"""Tenant-safe KV end to end on the sim (which salts its cache and its KV events as vLLM does):
``serve`` with kv-aware routing, two sims, ``cache_isolation: key``. Another key's first request
for a tenant's long prompt is served from no cached block and the router predicted none; the
tenant's repeat lands on the sim holding its blocks and hits them. Without isolation the same
two requests share the cache (what isolation takes away)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from infera_core.kv.component import KvRouting
from infera_core.kv.settings import KvSettings
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import RunningServer, serving, settings_for, until

sim_testing = pytest.importorskip("infera_sim.testing")

BS = 16
MODEL = "sim-model"
PROMPT = "tenant secret context " + " ".join(f"w{i * 7 % 9973}" for i in range(700))


@pytest.fixture(scope="module")
def sims() -> Iterator[list[Any]]:
    with sim_testing.start_sims(2, block_size=BS, speedup="inf") as handles:
        yield handles


def _keys(tmp_path: Path, isolation: str) -> Path:
    path = tmp_path / f"keys-{isolation}.yaml"
    keys = [{"name": "alice", "key": "sk-alice"}, {"name": "bob", "key": "sk-bob"}]
    path.write_text(yaml.safe_dump({"cache_isolation": isolation, "keys": keys}))
    return path


async def _complete(srv: RunningServer, key: str) -> tuple[str, int, int]:
    """(worker, prompt tokens, cached tokens) of one completion of PROMPT sent with ``key``."""
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 1}
    async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
        r = await client.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    return (
        r.headers["x-infera-worker"],
        usage["prompt_tokens"],
        usage["prompt_tokens_details"]["cached_tokens"],
    )


def _blocks(kv: KvRouting, worker: str) -> int:
    view = kv.index.view(worker)
    return view.block_count() if view is not None else 0


def _predicted(srv: RunningServer, key: str) -> float:
    child = srv.core.salting.tokens.children.get((key, "predicted_cached"))
    return child.value if child is not None else 0.0


async def _run(sims: list[Any], keys: Path) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=5) as client:
        for sim in sims:  # each run starts from empty caches
            assert (await client.post(sim.url + "/reset_prefix_cache")).status_code == 200
    hooks = make_hooks()
    kv = KvRouting(hooks.catalog(), KvSettings())
    settings = settings_for(router_policy="kv-aware", api_key_file=keys)
    async with serving(settings, hooks, kv=kv) as srv:
        for i, sim in enumerate(sims):
            srv.store.put(sim.record(f"sim-{i}"))
        await srv.wait_workers(2)
        owner, tokens, first = await _complete(srv, "sk-alice")
        await until(lambda: _blocks(kv, owner) >= tokens // BS, within=10)
        bob = await _complete(srv, "sk-bob")
        bob_predicted = _predicted(srv, "bob")
        alice_before = _predicted(srv, "alice")
        again = await _complete(srv, "sk-alice")
        return {
            "owner": owner,
            "tokens": tokens,
            "first": first,
            "bob": bob,
            "bob_predicted": bob_predicted,
            "again": again,
            "alice_predicted": _predicted(srv, "alice") - alice_before,
        }


async def test_isolated_keys_never_share_cached_blocks_and_keep_their_own(
    sims: list[Any], tmp_path: Path
) -> None:
    out = await _run(sims, _keys(tmp_path, "key"))
    full = out["tokens"] // BS
    assert out["tokens"] > 40 * BS and out["first"] == 0
    assert out["bob"][2] == 0, "bob was served from alice's cached blocks"
    assert out["bob_predicted"] == 0, "the router credited alice's blocks to bob"
    worker, _, cached = out["again"]
    assert worker == out["owner"], "alice's repeat left the worker holding her blocks"
    assert cached >= (full - 1) * BS
    assert out["alice_predicted"] >= (full - 1) * BS


async def test_without_isolation_the_keys_share_the_cache(sims: list[Any], tmp_path: Path) -> None:
    out = await _run(sims, _keys(tmp_path, "none"))
    worker, _, cached = out["bob"]
    assert worker == out["owner"] and cached > 0 and out["bob_predicted"] > 0
