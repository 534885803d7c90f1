"""Tenant-safe KV end to end on the sim (which salts its cache and its KV events as vLLM does):
``serve`` with kv-aware routing, two sims, ``cache_isolation: key``. Another key's first request
for a tenant's long prompt is served from no cached block and the router predicted none; the
tenant's repeat lands on the sim holding its blocks and hits them. Without isolation the same
two requests share the cache (what isolation takes away)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kv_sim_rig import blocks, complete, predicted, reset_caches, serving_kv_aware

from infera_core.testing.server import until

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


async def _run(sims: list[Any], keys: Path) -> dict[str, Any]:
    await reset_caches(sims)
    records = [sim.record(f"sim-{i}") for i, sim in enumerate(sims)]
    async with serving_kv_aware(records, keys) as (srv, kv):
        owner, tokens, first = await complete(srv, "sk-alice", MODEL, PROMPT)
        await until(lambda: blocks(kv, owner) >= tokens // BS, within=10)
        bob = await complete(srv, "sk-bob", MODEL, PROMPT)
        bob_predicted = predicted(srv, "bob")
        alice_before = predicted(srv, "alice")
        again = await complete(srv, "sk-alice", MODEL, PROMPT)
        return {
            "owner": owner,
            "tokens": tokens,
            "first": first,
            "bob": bob,
            "bob_predicted": bob_predicted,
            "again": again,
            "alice_predicted": predicted(srv, "alice") - alice_before,
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
