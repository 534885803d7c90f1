"""The launcher learns what its engine's model serves (``WorkerRecord.tasks``) from the engine's
``/openapi.json`` route list, as vLLM mounts its routes per supported task; a router in front
then sends embeddings to it and chat elsewhere."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from infera_core.discovery.memory import MemoryDiscovery, MemoryStore
from infera_core.engines.base import RunningEngine
from infera_core.engines.settings import WorkerSettings
from infera_core.launcher.health import default_health_generate, serves_inference
from infera_core.launcher.runtime import WorkerLauncher
from infera_core.launcher.tasks import served_tasks
from infera_core.plugin.hooks import InferaHooks
from infera_core.testing.engine_contract import sample_launch_context
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import serving, settings_for
from infera_core.worker import WorkerRecord, tasks_of_routes

sim_testing = pytest.importorskip("infera_sim.testing")


def test_tasks_follow_vllms_routes() -> None:
    chat = ["/v1/chat/completions", "/v1/completions", "/tokenize", "/v1/models", "/v1/responses"]
    assert tasks_of_routes(chat) == ["generate"]
    embed = ["/v1/embeddings", "/v2/embed", "/pooling", "/score", "/v1/score", "/rerank", "/tokenize"]
    assert tasks_of_routes(embed) == ["embed", "score"]
    assert tasks_of_routes(["/classify", "/pooling"]) == ["classify"]
    assert tasks_of_routes(["/health"]) == []
    old = WorkerRecord.model_validate({"worker_id": "w", "url": "http://x", "model": "m", "engine": "e"})
    assert old.tasks == ["generate"] and old.generates  # an older launcher's record: generate only


async def test_served_tasks_from_the_engines_openapi() -> None:
    quiet = {"speedup": "inf", "kv_events_port": None, "kv_replay_port": None}
    with (
        sim_testing.start_sim(model="m", **quiet) as gen,
        sim_testing.start_sim(model="m", task="score", **quiet) as cross,
    ):
        async with httpx.AsyncClient(timeout=10) as client:
            assert await served_tasks(client, gen.url) == ["generate"]
            assert await served_tasks(client, cross.url) == ["score", "classify"]
            assert await served_tasks(client, "http://127.0.0.1:9") == []  # nothing there


@pytest.mark.parametrize("task", ["generate", "embed", "classify", "score"])
async def test_a_pooling_engine_is_ready_and_passes_the_generation_check(task: str) -> None:
    quiet = {"speedup": "inf", "kv_events_port": None, "kv_replay_port": None}
    with sim_testing.start_sim(model="m", task=task, **quiet) as sim:
        async with httpx.AsyncClient(timeout=10) as client:
            engine = RunningEngine(sample_launch_context(model="m"), client, sim.url)
            assert await serves_inference(engine, [])
            assert await default_health_generate(engine)


async def test_the_launcher_registers_an_embedding_worker_the_router_sends_embeddings_to() -> None:
    store = MemoryStore()
    settings = WorkerSettings(model="emb", discovery="memory", health_interval=0.1)
    launcher = WorkerLauncher(
        InferaHooks.load(), "sim", settings, engine_args=["--task", "embed"], discovery=MemoryDiscovery(store)
    )
    task = asyncio.create_task(launcher.run())
    try:
        await launcher.wait_registered(within=60)
        assert launcher.record is not None and launcher.record.tasks == ["embed", "score"]
        async with serving(settings_for(), make_hooks(), store=store) as srv:
            await srv.wait_workers(1)
            async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
                r = await client.post("/v1/embeddings", json={"model": "emb", "input": "hi"})
                assert r.status_code == 200, r.text
                assert len(r.json()["data"][0]["embedding"]) == 64
                chat = {"model": "emb", "messages": [{"role": "user", "content": "hi"}]}
                r = await client.post("/v1/chat/completions", json=chat)
                assert r.status_code == 400 and r.json()["error"]["code"] == "model_not_supported", r.text
                workers = (await client.get("/v1/workers")).json()["data"]
                assert workers[0]["tasks"] == ["embed", "score"]
    finally:
        await launcher.stop()
        await task
