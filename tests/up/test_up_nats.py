"""``infera-run up`` on the production plane: NATS discovery, requests and KV events, with the
nats-server the stack starts itself."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest
from rich.console import Console

from infera_core.config.settings import compose_settings
from infera_core.plugin.hooks import InferaHooks
from infera_core.plugin.settings import backend_models
from infera_core.up.demo import DemoWorkload, run_demo
from infera_core.up.settings import UpSettings
from infera_core.up.stack import Stack

pytest.importorskip("infera_sim")
pytest.importorskip("infera_policies")
pytest.importorskip("infera_nats")


def _nats_up(**values: object) -> tuple[UpSettings, InferaHooks]:
    hooks = InferaHooks.load()
    model = compose_settings(UpSettings, backend_models(hooks.catalog()))
    plane = {"discovery": "nats", "request_transport": "nats", "kv_event_transport": "nats"}
    return model(**plane, **values), hooks  # type: ignore[arg-type]


@pytest.mark.slow
async def test_up_on_the_nats_plane_serves_both_apis_and_routes_kv_aware() -> None:
    settings, hooks = _nats_up(workers=3, policy="kv-aware", port=0, quiet=True, drain_timeout=2)
    engine_args = ["--speedup", "20", "--cache-blocks", "2048"]
    async with Stack(settings, hooks, engine_args=engine_args) as stack:
        assert stack.nats is not None  # no --nats-url: the stack runs its own nats-server
        nats_port = stack.nats.port
        # ... an authenticated one: each part connects as its role; nobody else gets in
        from infera_nats.transport_connect import NatsUnreachableError, connect_nats

        with pytest.raises(NatsUnreachableError, match="refused the credentials"):
            await connect_nats(stack.nats.url, "anonymous", 3.0)
        assert stack.discovery is not None
        records = await stack.discovery.list_workers()
        assert len(records) == 3
        assert {(r.request_transport, r.kv_event_transport) for r in records} == {("nats", "nats")}
        assert all(r.request_params.get("subject") for r in records)
        async with httpx.AsyncClient(timeout=30) as client:
            chat = await client.post(
                f"{stack.url}/chat/completions",
                json={"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            )
            assert chat.status_code == 200, chat.text
            assert chat.json()["choices"][0]["message"]["content"]
            messages = await client.post(
                f"{stack.url}/messages",
                json={"model": "sim-model", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
            )
            assert messages.status_code == 200, messages.text
            assert messages.json()["type"] == "message"
            # KV events reach the router through JetStream: once the worker that served a
            # prompt shows its blocks in the router's index, kv-aware keeps that prompt there
            body = {"model": "sim-model", "prompt": " ".join(f"word{i}" for i in range(300)), "max_tokens": 2}
            first = await client.post(f"{stack.url}/completions", json=body)
            assert first.status_code == 200, first.text
            owner = first.headers["x-infera-worker"]

            async def cached() -> bool:
                view = await client.get(f"{stack.root}/v1/admin/cache-view/{owner}")
                return view.status_code == 200 and bool(view.json()["blocks"])

            async with asyncio.timeout(60):
                while not await cached():  # noqa: ASYNC110 (the index is in the router: no event to wait on)
                    await asyncio.sleep(0.1)
            picks = {
                (await client.post(f"{stack.url}/completions", json=body)).headers["x-infera-worker"]
                for _ in range(4)
            }
            assert picks == {owner}
        w = DemoWorkload(groups=4, questions_per_group=4, prefix_len=300, question_len=12, output_len=4)
        rr, routed = await run_demo(stack, Console(quiet=True), w)
    assert rr.summary["completed"] == routed.summary["completed"] == 16
    # (which policy caches more over these 16 requests depends on how soon JetStream delivers
    # the events after each answer: the routing itself is asserted above, on a condition)
    assert routed.summary["prefix_cache_hit_rate"] is not None
    with socket.socket() as sock:  # the embedded nats-server stopped with the stack
        assert sock.connect_ex(("127.0.0.1", nats_port)) != 0
