"""The three engine adapters pass core's EngineAdapterContract (run against fake engine venvs)."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
from engine_env import make_engine_env
from infera_atom.adapter import SERVER_MODULE, AtomAdapter
from infera_sglang.adapter import LAUNCH_MODULE, SglangAdapter
from infera_vllm.adapter import API_SERVER_MODULE, VllmAdapter

from infera_core.engine import EngineOption, LaunchContext, LaunchSpec, RecordFields
from infera_core.errors import PluginError
from infera_core.hookspecs import hookimpl
from infera_core.registry import EngineRegistry
from infera_core.testing.contracts import EngineAdapterContract, sample_launch_context
from infera_core.testing.fixtures import make_hooks

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


class TestAtomContract(_WithFakeEngine):
    adapter = AtomAdapter()
    module = SERVER_MODULE


class _OldContract:
    """A third-party adapter written for the old ``is_ready(client, base_url)`` checks."""

    name = "old-engine"
    description = "Written against the (client, base_url) checks."
    package_hint = "pip install old-engine"

    def options(self) -> Sequence[EngineOption]:
        return []

    def build_launch(self, ctx: LaunchContext) -> LaunchSpec:
        return LaunchSpec(argv=["old-engine"])

    def record_fields(self, ctx: LaunchContext) -> RecordFields:
        return RecordFields()

    async def is_ready(self, client: Any, base_url: str) -> bool:
        return True

    async def in_flight(self, client: Any, base_url: str) -> int | None:
        return 0


class _OldPlugin:
    @hookimpl
    def infera_register_engines(self, registry: EngineRegistry) -> None:
        registry.add(_OldContract())


def test_an_adapter_with_the_old_check_signatures_fails_at_load_naming_its_plugin() -> None:
    hooks = make_hooks(("old-engine-plugin", _OldPlugin()))
    with pytest.raises(PluginError) as err:
        hooks.catalog()
    message = str(err.value)
    assert "plugin 'old-engine-plugin' registered engine 'old-engine'" in message
    assert "is_ready(client, base_url), in_flight(client, base_url)" in message
    assert "RunningEngine" in message and "\n" not in message
