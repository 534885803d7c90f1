"""The transfer hooks in a real launch: a third-party plugin's connector and amendment reach the
engine's argv and the registered worker record (SGLang stand-in engine served by infera-sim)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from standin_engines import standin_source

from infera_core.discovery.memory import MemoryDiscovery, MemoryStore
from infera_core.engines.base import LaunchContext, LaunchSpec
from infera_core.engines.settings import WorkerSettings
from infera_core.engines.transfer import TransferConnectorRegistry, TransferPlan
from infera_core.launcher.runtime import WorkerLauncher
from infera_core.plugin.spec import hookimpl
from infera_core.testing.engine_env import make_engine_env
from infera_core.testing.fixtures import make_hooks
from infera_core.worker import PdInfo, Role

pytestmark = pytest.mark.slow


class FakeBackend:
    """SGLang's test-only ``fake`` transfer backend, which the sglang plugin does not register."""

    engine = "sglang"
    name = "fake"
    native = ("fake",)
    description = "test: SGLang's fake backend"

    def build(self, ctx: LaunchContext, user: dict[str, Any]) -> TransferPlan:
        flags = ["--disaggregation-mode", ctx.role.value, "--disaggregation-transfer-backend", "fake"]
        pd = PdInfo(protocol="sglang-bootstrap", params={"transfer_backend": "fake", "tp_size": 1})
        return TransferPlan(engine="sglang", role=ctx.role, connector=self.name, flags=flags, pd=pd)


class Plugin:
    def __init__(self) -> None:
        self.argv: list[str] = []

    @hookimpl
    def infera_register_transfer_connectors(self, registry: TransferConnectorRegistry) -> None:
        registry.add(FakeBackend())

    @hookimpl
    def infera_amend_kv_transfer(self, context: LaunchContext, plan: TransferPlan) -> None:
        plan.flags += ["--disaggregation-ib-device", "mlx5_0"]
        assert plan.pd is not None
        plan.pd.params["ib_device"] = "mlx5_0"

    @hookimpl
    def infera_mutate_engine_launch(self, context: LaunchContext, spec: LaunchSpec) -> None:
        self.argv = list(spec.argv)  # what the engine is started with


async def test_a_plugin_connector_and_amendment_reach_the_engine_and_the_record(tmp_path: Path) -> None:
    env = make_engine_env(tmp_path, "sglang.launch_server", source=standin_source("sglang_launch_server"))
    plugin = Plugin()
    launcher = WorkerLauncher(
        make_hooks(("third-party", plugin)),
        "sglang",
        WorkerSettings(
            model="qwen", worker_id="sg-p", role=Role.PREFILL, engine_python=env.python, drain_timeout=2
        ),
        options={"transfer_backend": "fake"},
        discovery=MemoryDiscovery(MemoryStore()),
        echo=lambda line: None,
    )
    task = asyncio.create_task(launcher.run())
    try:
        record = await launcher.wait_registered(within=60)
        argv = plugin.argv
        assert argv[argv.index("--disaggregation-transfer-backend") + 1] == "fake"
        assert argv[argv.index("--disaggregation-ib-device") + 1] == "mlx5_0"
        assert record.pd == PdInfo(
            protocol="sglang-bootstrap",
            params={"transfer_backend": "fake", "tp_size": 1, "ib_device": "mlx5_0"},
        )
    finally:
        await launcher.stop()
        assert await task == 0
