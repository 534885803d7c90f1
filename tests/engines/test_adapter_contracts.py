"""The three engine adapters pass core's EngineAdapterContract (run against fake engine venvs)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import ClassVar

from engine_env import make_engine_env
from infera_atom.adapter import SERVER_MODULE, AtomAdapter
from infera_sglang.adapter import LAUNCH_MODULE, SglangAdapter
from infera_vllm.adapter import API_SERVER_MODULE, VllmAdapter

from infera_core.engine import LaunchContext
from infera_core.testing.contracts import EngineAdapterContract, sample_launch_context

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
