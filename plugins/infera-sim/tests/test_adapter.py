"""The ``sim`` engine adapter, run by the real launcher with in-memory discovery."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from infera_sim.adapter import SimAdapter
from infera_sim.testing import KvMirror
from infera_sim.tokenizer import SimTokenizerFactory

from infera_core.discovery.memory import MemoryDiscovery, MemoryStore
from infera_core.engines.base import LaunchContext, RunningEngine
from infera_core.engines.settings import WorkerSettings
from infera_core.errors import EngineError
from infera_core.launcher.runtime import WorkerLauncher
from infera_core.testing.fixtures import make_hooks
from infera_core.util.net import free_port
from infera_core.worker import Role


def _ctx(
    role: Role = Role.MIXED,
    engine_args: list[str] | None = None,
    advertise: str = "127.0.0.1",
    **options: Any,
) -> LaunchContext:
    return LaunchContext(
        worker_id="w-1",
        model="m",
        model_path=None,
        role=role,
        host="127.0.0.1",
        port=8123,
        advertise_host=advertise,
        engine_args=engine_args or [],
        options=options,
        free_port=free_port,
    )


def test_an_ipv6_advertise_host_is_bracketed_in_every_url() -> None:
    ctx = _ctx(advertise="fd00::7")
    assert ctx.url == "http://[fd00::7]:8123"
    kv = SimAdapter().record_fields(ctx).kv_events
    assert kv is not None and kv.endpoint.startswith("tcp://[fd00::7]:")
    assert kv.replay_endpoint is None or kv.replay_endpoint.startswith("tcp://[fd00::7]:")


def test_argv_and_record_agree() -> None:
    adapter = SimAdapter()
    ctx = _ctx(Role.PREFILL, ["--block-size", "32"], cache_blocks=64, pd_protocol="sglang-bootstrap")
    argv = adapter.build_launch(ctx).argv
    assert argv[1:3] == ["-m", "infera_sim.server"]
    fields = adapter.record_fields(ctx)
    assert fields.kv_events is not None and fields.pd is not None
    kv_port = argv[argv.index("--kv-events-port") + 1]
    assert fields.kv_events.endpoint == f"tcp://127.0.0.1:{kv_port}"
    assert fields.kv_events.block_size == 32  # engine args after -- win
    assert fields.kv_events.format == "vllm"
    assert fields.kv_events.fingerprint == SimTokenizerFactory().create("m", {}).fingerprint
    assert fields.pd.protocol == "sglang-bootstrap"
    assert str(fields.pd.params["bootstrap_port"]) == argv[argv.index("--bootstrap-port") + 1]
    assert adapter.record_fields(_ctx()).pd is None
    with pytest.raises(EngineError, match="--no-such-flag"):
        adapter.build_launch(_ctx(engine_args=["--no-such-flag"]))


async def test_launcher_runs_a_sim_worker() -> None:
    store = MemoryStore()
    launcher = WorkerLauncher(
        make_hooks(),
        "sim",
        WorkerSettings(model="m", worker_id="sim-0", drain_timeout=5),
        engine_args=["--speedup", "inf"],
        options={"cache_blocks": 64, "block_size": 16},
        discovery=MemoryDiscovery(store),
        echo=lambda line: None,
    )
    task = asyncio.create_task(launcher.run())
    try:
        record = await launcher.wait_registered(within=60)
        assert record.engine == "sim" and record.kv_events is not None
        mirror = KvMirror(record.kv_events.endpoint, record.kv_events.replay_endpoint)
        try:
            async with httpx.AsyncClient(timeout=10) as client:
                resp = await client.post(
                    record.url + "/v1/completions",
                    json={"model": "m", "prompt": "a b c " * 20, "max_tokens": 2},
                )
                assert resp.status_code == 200
                cache = (await client.get(record.url + "/sim/cache")).json()
                adapter = SimAdapter()
                engine = RunningEngine(_ctx(), client, record.url)
                assert await adapter.is_ready(engine)
                assert await adapter.in_flight(engine) == 0
            await asyncio.to_thread(mirror.sync, cache["next_seq"])
            assert mirror.blocks == set(cache["block_hashes"]) and mirror.blocks
        finally:
            mirror.close()
    finally:
        await launcher.stop()
    assert await task == 0
