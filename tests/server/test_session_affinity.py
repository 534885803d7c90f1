"""Session affinity against real sims: a conversation (session header, ``user``,
``metadata.user_id``) stays on its worker; an overloaded or gone worker is left, and the
session then sticks to its new worker. Both the ``session-affinity`` preset and the term in
``kv-aware``."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from infera_core.kv.component import KvRouting
from infera_core.kv.settings import KvSettings
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import RunningServer, serving, settings_for, until

sim_testing = pytest.importorskip("infera_sim.testing")

MODEL = "sim-model"


@pytest.fixture(scope="module")
def sims() -> Iterator[list[Any]]:
    # slow enough decoding that a 200-token stream stays in flight while the test looks
    with sim_testing.start_sims(3, model=MODEL, itl_base_ms=20) as handles:
        yield handles


@contextlib.asynccontextmanager
async def router(sims: list[Any], policy: str, **settings: Any) -> AsyncIterator[RunningServer]:
    hooks = make_hooks()
    kv = KvRouting(hooks.catalog(), KvSettings())
    async with serving(settings_for(router_policy=policy, **settings), hooks, kv=kv) as srv:
        for i, sim in enumerate(sims):
            srv.store.put(sim.record(f"sim-{i}"))
        await srv.wait_workers(len(sims))
        yield srv


async def ask(c: httpx.AsyncClient, turn: int, headers: dict[str, str] | None = None, **body: Any) -> str:
    payload = {"model": MODEL, "prompt": f"turn {turn}: {'different words ' * (turn % 5)} {turn * 7919}"}
    r = await c.post("/v1/completions", json={**payload, "max_tokens": 1, **body}, headers=headers)
    assert r.status_code == 200, r.text
    return r.headers["x-infera-worker"]


async def picked(c: httpx.AsyncClient, path: str, body: dict[str, Any], headers: dict[str, str]) -> str:
    """The worker a request went to, from its routing explanation (every route carries one)."""
    r = await c.post(path, json=body, headers={**headers, "X-Infera-Explain": "1"})
    assert r.status_code == 200, r.text
    return str(json.loads(r.headers["x-infera-explain"])["picked"])


async def test_kv_aware_keeps_a_session_on_its_worker_until_overloaded_or_gone(sims: list[Any]) -> None:
    async with router(sims, "kv-aware") as srv, httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
        conv = {"X-Session-Id": "conv-1"}
        home = await ask(c, 0, conv)
        assert {await ask(c, t, conv) for t in range(1, 6)} == {home}
        # agent clients' own headers, and the body's user / prompt_cache_key / metadata.user_id
        for headers, body in [
            ({"session_id": "codex-7"}, {}),
            ({"X-Claude-Code-Session-Id": "cc-1"}, {}),
            ({}, {"user": "alice"}),
            ({}, {"prompt_cache_key": "thread-9"}),
        ]:
            first = await ask(c, 50, headers, **body)
            assert {await ask(c, 50 + t, headers, **body) for t in range(1, 5)} == {first}, (headers, body)
        meta = {"model": MODEL, "max_tokens": 1, "metadata": {"user_id": "claude-session-42"}}
        turns = [
            await picked(
                c, "/v1/messages", {**meta, "messages": [{"role": "user", "content": f"q{t} " * t}]}, {}
            )
            for t in range(5)
        ]
        assert len(set(turns)) == 1, turns

        # overloaded: long streams of the session pile up on its worker; the guard moves it
        moved = None
        async with contextlib.AsyncExitStack() as stack:
            for t in range(24):
                body = {"model": MODEL, "prompt": f"long {t}", "max_tokens": 150, "stream": True}
                resp = await stack.enter_async_context(
                    c.stream("POST", "/v1/completions", json=body, headers={**conv, "X-Infera-Explain": "1"})
                )
                if resp.headers["x-infera-worker"] != home:
                    moved = resp.headers["x-infera-worker"]
                    break
            assert moved is not None and t >= 3, t  # stayed home while it could take more
            # the moved stream's own explanation (its trailing SSE comment): the guard left home
            text = (await resp.aread()).decode()
            why = json.loads(text.rstrip().splitlines()[-1].removeprefix(": infera-explain "))
            assert why["picked"] == moved
            assert {"worker": home, "by": "imbalance-guard"} in why["excluded"], why
        await until(lambda: srv.core.table.by_id[home].in_flight == 0, 30)
        # the session follows its new worker
        now = await ask(c, 7, conv)
        assert now != home
        assert {await ask(c, t, conv) for t in range(8, 11)} == {now}

        # gone: its worker leaves the fleet; the session moves once, then sticks again
        srv.store.delete(now)
        await until(lambda: now not in srv.core.table.by_id, 10)
        again = await ask(c, 20, conv)
        assert again != now
        assert {await ask(c, t, conv) for t in range(21, 25)} == {again}


async def test_kv_aware_without_a_session_spreads_turns(sims: list[Any]) -> None:
    """The same distinct-prompt turns without a session key go wherever fill and load say:
    the stickiness above is the session term's."""
    async with router(sims, "kv-aware") as srv, httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
        assert len({await ask(c, 1000 + t) for t in range(6)}) > 1


async def test_the_session_affinity_preset_knows_the_agent_headers(sims: list[Any]) -> None:
    """The consistent-hashing preset reads the same session keys (``--session-header``)."""
    async with router(sims, "session-affinity") as srv, httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
        for headers, body in [({"session_id": "codex-1"}, {}), ({}, {"prompt_cache_key": "t-1"})]:
            first = await ask(c, 0, headers, **body)
            assert {await ask(c, t, headers, **body) for t in range(1, 6)} == {first}
