"""docs/how-to/kv-transfer-connector.md (transfer connectors, plan amendments, ``default_policy``):
their ``python`` blocks are not files of the guide's example plugin, so this test runs them as
plugins against the real vLLM adapter and ``infera-run up``'s policy choice (no engine starts)."""

from __future__ import annotations

import json
import re
import types
from pathlib import Path
from typing import Any

import pytest
from infera_vllm.adapter import VllmAdapter
from infera_vllm.transfer import transfer_plan

from infera_core.engines.base import EngineRegistry, LaunchContext
from infera_core.plugin.hooks import InferaHooks
from infera_core.plugin.spec import hookimpl
from infera_core.testing.contracts import sample_launch_context
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.transfer_contract import TransferConnectorContract
from infera_core.worker import Role

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "kv-transfer-connector.md"
FENCE = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _blocks() -> list[str]:
    return FENCE.findall(GUIDE.read_text())


BLOCKS = _blocks()


def _module(name: str, source: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(compile(source, f"docs/how-to/kv-transfer-connector.md ({name})", "exec"), module.__dict__)
    return module


def _vllm_ctx(hooks: InferaHooks, role: Role, **options: Any) -> LaunchContext:
    adapter = VllmAdapter()
    defaults = {o.name: o.default for o in adapter.options()}
    return sample_launch_context(role=role, options={**defaults, **options}, hooks=hooks)


def test_the_sections_have_their_three_blocks() -> None:
    assert len(BLOCKS) == 3, f"expected 3 python blocks in the how-to, found {len(BLOCKS)}"


@pytest.fixture(scope="module")
def efa() -> types.ModuleType:
    return _module("guide_nixl_efa", BLOCKS[0])


@pytest.fixture(scope="module")
def amend() -> types.ModuleType:
    return _module("guide_amend", BLOCKS[1])


def test_a_registered_connector_is_picked_by_pd_connector(efa: types.ModuleType) -> None:
    hooks = make_hooks(("guide-efa", efa))
    assert "nixl-efa" in hooks.transfer_connectors("vllm")
    ctx = _vllm_ctx(hooks, Role.PREFILL, pd_connector="nixl-efa")
    flags = VllmAdapter().engine_flags(ctx)
    config = json.loads(flags[flags.index("--kv-transfer-config") + 1])
    assert config["kv_connector"] == "NixlConnector" and config["kv_role"] == "kv_both"
    assert config["kv_connector_extra_config"] == {"backends": ["LIBFABRIC"]}
    plan = transfer_plan(ctx)
    assert plan.connector == "nixl-efa" and "VLLM_NIXL_SIDE_CHANNEL_PORT" in plan.env
    pd = VllmAdapter().record_fields(ctx).pd
    assert pd is not None and pd.protocol == "vllm-nixl"


def test_the_guides_connector_passes_the_transfer_contract_kit(efa: types.ModuleType) -> None:
    suite: Any = type("Suite", (TransferConnectorContract,), {"connector": efa.NixlOverEfa()})()
    for check in [n for n in dir(suite) if n.startswith("test_")]:
        getattr(suite, check)()


def test_the_amendment_reaches_nixl_workers_only(amend: types.ModuleType) -> None:
    hooks = make_hooks(("guide-amend", amend))
    assert transfer_plan(_vllm_ctx(hooks, Role.DECODE)).env["UCX_NET_DEVICES"] == "mlx5_0:1"
    mooncake = transfer_plan(_vllm_ctx(hooks, Role.PREFILL, pd_connector="mooncake"))
    mixed = transfer_plan(_vllm_ctx(hooks, Role.MIXED))
    assert "UCX_NET_DEVICES" not in mooncake.env and "UCX_NET_DEVICES" not in mixed.env


def test_default_policy_is_what_up_routes_with() -> None:
    from infera_core.up.stack import default_policy

    guide = _module("guide_default_policy", BLOCKS[2])

    class Plugin:
        @hookimpl
        def infera_register_engines(self, registry: EngineRegistry) -> None:
            registry.add(guide.EchoWithoutEvents())

    hooks = make_hooks(("guide-no-events", Plugin()))
    assert default_policy(hooks, "echo-no-events") == "approximate-prefix"
    assert default_policy(hooks, "echo") == "kv-aware"  # the guide's echo publishes KV events
    ctx = sample_launch_context(options={"block_size": 16})
    assert guide.EchoWithoutEvents().record_fields(ctx).kv_events is None
