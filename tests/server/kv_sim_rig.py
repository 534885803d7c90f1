"""Shared rig of the kv-aware tests over sims with API keys: a router over the sims' records,
one completion's (worker, prompt tokens, cached tokens), the blocks the index holds for a worker
and the tokens the router predicted cached for a key."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import httpx

from infera_core.kv.component import KvRouting
from infera_core.kv.settings import KvSettings
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import RunningServer, serving, settings_for
from infera_core.worker import WorkerRecord


async def reset_caches(sims: Iterable[Any]) -> None:
    """Empty the sims' prefix caches (each run starts from cold caches)."""
    async with httpx.AsyncClient(timeout=5) as client:
        for sim in sims:
            assert (await client.post(sim.url + "/reset_prefix_cache")).status_code == 200


@contextlib.asynccontextmanager
async def serving_kv_aware(
    records: list[WorkerRecord], keys: Path | None = None
) -> AsyncIterator[tuple[RunningServer, KvRouting]]:
    """A kv-aware router (with the API-key file ``keys``, if any) serving ``records`` once its
    table holds them all; and its KV routing (the index)."""
    hooks = make_hooks()
    kv = KvRouting(hooks.catalog(), KvSettings())
    async with serving(settings_for(router_policy="kv-aware", api_key_file=keys), hooks, kv=kv) as srv:
        for record in records:
            srv.store.put(record)
        await srv.wait_workers(len(records))
        yield srv, kv


async def complete(srv: RunningServer, key: str, model: str, prompt: str) -> tuple[str, int, int]:
    """(worker, prompt tokens, cached tokens) of one completion of ``prompt`` sent with ``key``."""
    body = {"model": model, "prompt": prompt, "max_tokens": 1}
    async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
        r = await client.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    return (
        r.headers["x-infera-worker"],
        usage["prompt_tokens"],
        usage["prompt_tokens_details"]["cached_tokens"],
    )


def blocks(kv: KvRouting, worker: str) -> int:
    """The blocks the router's index holds for ``worker``."""
    view = kv.index.view(worker)
    return view.block_count() if view is not None else 0


def predicted(srv: RunningServer, name: str) -> float:
    """The tokens the router predicted cached for key ``name`` so far."""
    child = srv.core.salting.tokens.children.get((name, "predicted_cached"))
    return child.value if child is not None else 0.0


@contextlib.asynccontextmanager
async def kv_aware_over_sims(sims: list[Any]) -> AsyncIterator[tuple[RunningServer, KvRouting]]:
    """:func:`serving_kv_aware` over ``sims`` (workers ``sim-0``, ``sim-1``…), their caches
    emptied first."""
    await reset_caches(sims)
    async with serving_kv_aware([sim.record(f"sim-{i}") for i, sim in enumerate(sims)]) as out:
        yield out
