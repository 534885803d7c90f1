"""The launcher learns the LoRA adapters its engine serves from the engine's ``/v1/models``
(entries with a ``parent``, as vLLM lists ``--lora-modules``) and puts them in the record it
registers; a router in front then routes the adapters' names to it."""

from __future__ import annotations

import asyncio

import httpx

from infera_core.discovery.memory import MemoryDiscovery, MemoryStore
from infera_core.engines.settings import WorkerSettings
from infera_core.launcher.runtime import WorkerLauncher
from infera_core.plugin.hooks import InferaHooks
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import serving, settings_for


async def test_the_launcher_registers_its_engines_adapters_and_the_router_routes_them() -> None:
    store = MemoryStore()
    settings = WorkerSettings(model="sim-model", discovery="memory")
    launcher = WorkerLauncher(
        InferaHooks.load(),
        "sim",
        settings,
        engine_args=["--enable-lora", "--lora-modules", "sql-lora=/a", "chat-lora=/b"],
        discovery=MemoryDiscovery(store),
    )
    task = asyncio.create_task(launcher.run())
    try:
        await launcher.wait_registered(within=60)
        assert launcher.record is not None
        assert launcher.record.lora_adapters == ["chat-lora", "sql-lora"]
        async with serving(settings_for(), make_hooks(), store=store) as srv:
            await srv.wait_workers(1)
            async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
                r = await client.post(
                    "/v1/completions", json={"model": "sql-lora", "prompt": "hi", "max_tokens": 2}
                )
                assert r.status_code == 200, r.text
                assert r.json()["model"] == "sql-lora"
    finally:
        await launcher.stop()
        await task
