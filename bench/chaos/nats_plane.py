"""Chaos scenario: requests over the NATS plane's ``max_payload`` (issue #28, row 6; see ``run.py``).

Its own plane: a real ``nats-server`` (max_payload 1 MiB), two stand-in engines, each behind
a responder (``--request-transport nats``), and a router reaching them over NATS. Bursts of
2 MB requests are sent with ordinary ones between them. Before the fix each oversized
request counted as the worker's failure: three opened every breaker and 65 % of the
ordinary traffic got 503. Reported: what the oversized and the ordinary requests got,
whether any oversized request reached a worker, and the breakers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

import httpx

from bench.chaos.stack import ChaosStack, Row, codes_text, scenario
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import RunningServer, serving, settings_for
from infera_core.testing.upstream import FakeUpstream, record_for
from infera_core.util.nats_server import NatsServer, nats_server_binary

BIG = 2 << 20
ROUNDS = 6


@contextlib.asynccontextmanager
async def nats_plane(workers: int = 2) -> AsyncIterator[tuple[RunningServer, list[Any]]]:
    """A router reaching ``workers`` stand-in engines over a fresh ``nats-server``."""
    from infera_nats.responder import Responder

    server = NatsServer()
    await asyncio.to_thread(server.start)
    old = os.environ.get("INFERA_NATS_URL")
    os.environ["INFERA_NATS_URL"] = server.url  # the router's --nats-url
    ups: list[FakeUpstream] = []
    responders: list[Any] = []
    try:
        for i in range(workers):
            up = FakeUpstream(f"nats-w{i}", chunks=8)
            await up.start()
            ups.append(up)
            responder = Responder(up.name, up.url, server.url, connect_timeout=5.0)
            await responder.start()
            responders.append(responder)
        async with serving(settings_for(request_transport="nats"), make_hooks()) as srv:
            for up, r in zip(ups, responders, strict=True):
                srv.store.put(record_for(up, request_transport="nats", request_params={"subject": r.subject}))
            await srv.wait_workers(workers, within=20)
            yield srv, responders
    finally:
        for r in responders:
            await r.close(grace=0.5)
        for up in ups:
            await up.stop()
        if old is None:
            os.environ.pop("INFERA_NATS_URL", None)
        else:
            os.environ["INFERA_NATS_URL"] = old
        await asyncio.to_thread(server.close)


def _chat(chars: int) -> dict[str, Any]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": "x" * chars}], "max_tokens": 4}


@scenario(fast=True)
async def nats_oversized(stack: ChaosStack) -> Row:
    """Bursts of 2 MB requests (over NATS max_payload) among ordinary ones, on the NATS plane."""
    del stack  # its own plane: a nats-server, responders and a router
    tried = f"NATS plane: {ROUNDS} bursts of 4 × 2 MB requests (over max_payload 1 MiB) among ordinary ones"
    if nats_server_binary() is None:
        return Row(tried, "skipped: nats-server is not installed", "-", True)
    big, small = _chat(BIG), _chat(8)
    async with nats_plane() as (srv, responders), httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
        over: list[int] = []
        legit: list[int] = []
        for _ in range(ROUNDS):
            rs = await asyncio.gather(
                *(c.post("/v1/chat/completions", json=big) for _ in range(4)),
                *(c.post("/v1/chat/completions", json=small) for _ in range(4)),
            )
            over += [r.status_code for r in rs[:4]]
            legit += [r.status_code for r in rs[4:]]
        reached = sum(r.requests for r in responders)
        core = srv.core
        opened = core.breakers.opened
        open_now = [ep.worker_id for ep in core.table.by_id.values() if ep.breaker_open]
    ok_share = 100 * legit.count(200) / len(legit)
    ok = set(over) == {413} and ok_share == 100 and opened == 0 and reached == len(legit)
    breakers = "no breaker opened" if not opened else f"breakers opened {opened}× (open now: {open_now})"
    return Row(
        tried,
        f"oversized: {codes_text(over)}; ordinary: {codes_text(legit)} ({ok_share:.0f} % served)",
        f"nothing; {breakers}; {reached - len(legit)} oversized requests reached a worker"
        if ok
        else f"{breakers}; {reached} requests reached the workers",
        ok,
    )
