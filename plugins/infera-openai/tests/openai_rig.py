"""Shared by the infera-openai engine tests: a launch context for an adapter."""

from __future__ import annotations

from typing import Any

from infera_core.engines.base import LaunchContext
from infera_core.testing.contracts import sample_launch_context


def ctx(adapter: Any, **kw: Any) -> LaunchContext:
    options = {o.name: o.default for o in adapter.options()}
    options.update(kw.pop("options", {}))
    base: dict[str, Any] = {
        "worker_id": "w1",
        "model": "tiny",
        "model_path": "/models/tiny",
        "host": "0.0.0.0",
        "port": 30000,
        "advertise_host": "10.0.0.7",
        "options": options,
    }
    base.update(kw)
    return sample_launch_context(**base)
