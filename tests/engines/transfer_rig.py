"""Shared by the transfer-config tests: a golden launch context and the engine's KV config."""

from __future__ import annotations

import json
from typing import Any

from infera_core.engines.base import LaunchContext
from infera_core.testing.engine_env import GOLDEN_WORKER, launch_context
from infera_core.worker import Role


def ctx(role: Role = Role.PREFILL, first_port: int = 41000, **options: Any) -> LaunchContext:
    return launch_context(GOLDEN_WORKER, first_port, role=role, options={"tp": 1, **options})


def kv_config(flags: list[str]) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(flags[flags.index("--kv-transfer-config") + 1])
    return value
