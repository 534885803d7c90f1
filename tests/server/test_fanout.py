"""A request may not ask for more choices than the router allows (``n``, ``best_of``): an
out-of-range fan-out is a 400 naming the field, and nothing reaches a worker."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from infera_core.server.validate import MAX_CHOICES
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import RunningServer, serving, settings_for
from infera_core.testing.upstream import FakeUpstream, fake_upstreams, record_for

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
PROMPT = {"model": "fake-model", "prompt": "hi"}


@pytest.fixture
async def ups() -> AsyncIterator[list[FakeUpstream]]:
    async with fake_upstreams(1) as out:
        yield out


@pytest.fixture
async def srv(ups: list[FakeUpstream]) -> AsyncIterator[RunningServer]:
    async with serving(settings_for(), make_hooks()) as server:
        server.store.put(record_for(ups[0]))
        await server.wait_workers(1)
        yield server


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/chat/completions", {**CHAT, "n": 10**23}, "n"),
        ("/v1/chat/completions", {**CHAT, "n": 0}, "n"),
        ("/v1/chat/completions", {**CHAT, "n": "3"}, "n"),
        ("/v1/completions", {**PROMPT, "n": MAX_CHOICES + 1}, "n"),
        ("/v1/completions", {**PROMPT, "best_of": -1}, "best_of"),
    ],
)
async def test_out_of_range_fanout_is_refused_before_any_worker(
    srv: RunningServer, ups: list[FakeUpstream], path: str, body: dict[str, object], field: str
) -> None:
    async with httpx.AsyncClient(base_url=srv.url) as c:
        r = await c.post(path, json=body)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == field
    assert not ups[0].last_body


async def test_fanout_in_range_is_forwarded(srv: RunningServer, ups: list[FakeUpstream]) -> None:
    async with httpx.AsyncClient(base_url=srv.url) as c:
        r = await c.post("/v1/chat/completions", json={**CHAT, "n": 2})
    assert r.status_code == 200
    assert ups[0].last_body
