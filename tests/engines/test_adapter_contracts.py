"""The engine adapters pass core's EngineAdapterContract (vLLM/SGLang/ATOM against fake engine venvs),
the kit catches what it promises to catch, and an adapter on the old check signatures fails at load."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
from infera_atom.adapter import SERVER_MODULE, AtomAdapter
from infera_sglang.adapter import LAUNCH_MODULE, SglangAdapter
from infera_sim.adapter import SimAdapter
from infera_vllm.adapter import API_SERVER_MODULE, VllmAdapter

from infera_core.engines.base import (
    EngineOption,
    LaunchContext,
    LaunchSpec,
    RecordFields,
    RunningEngine,
)
from infera_core.engines.support import http_ok
from infera_core.testing.contracts import EngineAdapterContract, sample_launch_context
from infera_core.testing.engine_contract import Reply
from infera_core.testing.engine_env import make_engine_env
from infera_core.testing.standin_plugin import StandinAdapter

_ROOT = tempfile.TemporaryDirectory(prefix="infera-engine-contracts-")


def _python(module: str) -> str:
    root = Path(_ROOT.name) / module
    if not root.exists():
        make_engine_env(root, module)
    return str(root / "bin" / "python")


class _WithFakeEngine(EngineAdapterContract):
    module: ClassVar[str]

    def launch_context(self) -> LaunchContext:
        ctx = sample_launch_context(options={o.name: o.default for o in self.adapter.options()})
        ctx.engine_python = _python(self.module)
        ctx.discovery = "etcd"
        return ctx


class TestVllmContract(_WithFakeEngine):
    adapter = VllmAdapter()
    module = API_SERVER_MODULE


class TestSglangContract(_WithFakeEngine):
    adapter = SglangAdapter()
    module = LAUNCH_MODULE

    def standin_replies(self, *, ready: bool, in_flight: int) -> Mapping[str, Reply]:
        """SGLang's /health and its scheduler gauges on /metrics (with --enable-metrics)."""
        if not ready:
            return {"/health": (503, "")}
        metrics = (
            "# TYPE sglang:num_running_reqs gauge\n"
            f'sglang:num_running_reqs{{model_name="contract-model"}} {float(in_flight)}\n'
            "# TYPE sglang:num_queue_reqs gauge\n"
            'sglang:num_queue_reqs{model_name="contract-model"} 0.0\n'
        )
        return {"/health": (200, ""), "/metrics": (200, metrics)}


class TestAtomContract(_WithFakeEngine):
    adapter = AtomAdapter()
    module = SERVER_MODULE
    reports_in_flight = False  # ATOM's server exposes no running-request count


class TestSimContract(EngineAdapterContract):
    adapter = SimAdapter()


class TestStandinContract(EngineAdapterContract):
    adapter = StandinAdapter()


class _AlwaysReady(StandinAdapter):
    async def is_ready(self, engine: RunningEngine) -> bool:
        return True


class _FixedInFlight(StandinAdapter):
    async def in_flight(self, engine: RunningEngine) -> int | None:
        return 0


class _HealthOnly(StandinAdapter):
    """Ready as soon as anything answers on the port, even a 503 from a starting engine."""

    async def is_ready(self, engine: RunningEngine) -> bool:
        return (await engine.client.get(f"{engine.url}/health")).status_code < 600


class _PortOption(StandinAdapter):
    def options(self) -> Sequence[EngineOption]:
        return [
            *super().options(),
            EngineOption("port", int, 8000, "The engine's port."),
            EngineOption("role"),
        ]


class _SharedState(StandinAdapter):
    """Keeps the last launch's port on the adapter instance (the hidden state the contract forbids)."""

    def build_launch(self, ctx: LaunchContext) -> LaunchSpec:
        self.kv_port = ctx.free_port()
        return super().build_launch(ctx)

    def record_fields(self, ctx: LaunchContext) -> RecordFields:
        if not hasattr(self, "kv_port"):
            self.kv_port = ctx.free_port()
        return RecordFields(labels={"kv_port": str(self.kv_port)})


class _HealthyNoCount(StandinAdapter):
    async def is_ready(self, engine: RunningEngine) -> bool:
        return await http_ok(engine.client, f"{engine.url}/health")


@pytest.mark.parametrize(
    ("adapter", "check", "message"),
    [
        (
            _AlwaysReady,
            "test_readiness_and_in_flight_against_a_standin",
            "is_ready said True with nothing listening",
        ),
        (
            _HealthOnly,
            "test_readiness_and_in_flight_against_a_standin",
            "is_ready said True while the engine starts",
        ),
        (
            _FixedInFlight,
            "test_readiness_and_in_flight_against_a_standin",
            "in_flight said 0 with 3 requests running",
        ),
        (
            _PortOption,
            "test_options_do_not_clash_with_launcher_flags",
            "options named like launcher flags: --port",
        ),
        (_SharedState, "test_launch_state_lives_in_the_context", "changed after another launch"),
    ],
)
def test_the_contract_kit_catches(adapter: type[Any], check: str, message: str) -> None:
    suite = type("Suite", (EngineAdapterContract,), {"adapter": adapter()})()
    with pytest.raises(AssertionError, match=message) as err:
        getattr(suite, check)()
    if adapter is _PortOption:
        assert "--role" in str(err.value) and "ctx.port" in str(err.value)


def test_an_engine_without_in_flight_count_declares_it() -> None:
    """reports_in_flight = False: in_flight must then be None, not a made-up number."""
    quiet = type(
        "Quiet", (EngineAdapterContract,), {"adapter": _FixedInFlight(), "reports_in_flight": False}
    )()
    with pytest.raises(AssertionError, match="it should always be None"):
        quiet.test_readiness_and_in_flight_against_a_standin()
