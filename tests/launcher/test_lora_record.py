"""The launcher learns the LoRA adapters its engine serves from the engine's ``/v1/models``
(entries with a ``parent``, as vLLM lists ``--lora-modules``) and puts them in the record it
registers; a router in front then routes the adapters' names to it. Adapters loaded or
unloaded at run time (vLLM's ``/v1/load_lora_adapter``) are republished while it monitors."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from infera_core.discovery.memory import MemoryDiscovery, MemoryStore
from infera_core.engines.settings import WorkerSettings
from infera_core.launcher.lora import LoraRefresh
from infera_core.launcher.runtime import WorkerLauncher
from infera_core.plugin.hooks import InferaHooks
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.server import serving, settings_for, until


async def test_the_launcher_registers_its_engines_adapters_and_the_router_routes_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")  # the sim's load/unload routes
    store = MemoryStore()
    settings = WorkerSettings(model="sim-model", discovery="memory", health_interval=0.1)
    launcher = WorkerLauncher(
        InferaHooks.load(),
        "sim",
        settings,
        engine_args=["--enable-lora", "--lora-modules", "sql-lora=/a", "chat-lora=/b"],
        discovery=MemoryDiscovery(store),
    )
    launcher.lora_refresh = LoraRefresh(every=0.1)
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
                engine = launcher.record.url
                load = {"lora_name": "new-lora", "lora_path": "/c"}
                assert (await client.post(f"{engine}/v1/load_lora_adapter", json=load)).status_code == 200
                await until(lambda: "new-lora" in srv.core.table.lora_base, within=20)
                r = await client.post(
                    "/v1/completions", json={"model": "new-lora", "prompt": "hi", "max_tokens": 2}
                )
                assert r.status_code == 200, r.text
                unload = {"lora_name": "sql-lora"}
                assert (await client.post(f"{engine}/v1/unload_lora_adapter", json=unload)).status_code == 200
                await until(lambda: "sql-lora" not in srv.core.table.lora_base, within=20)
                r = await client.post(
                    "/v1/completions", json={"model": "sql-lora", "prompt": "hi", "max_tokens": 2}
                )
                assert r.status_code == 404, r.text
                assert store.records[launcher.record.worker_id].lora_adapters == ["chat-lora", "new-lora"]
    finally:
        await launcher.stop()
        await task
