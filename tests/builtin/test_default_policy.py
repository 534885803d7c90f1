"""``serve`` and ``up`` pick the same default preset: kv-aware when infera-policies is installed."""

from __future__ import annotations

import pytest

from infera_core.plugin.hooks import InferaHooks
from infera_core.scheduling.router_config import default_policy
from infera_core.server.app import create_app
from infera_core.server.settings import ServeSettings
from infera_core.up.settings import UpSettings
from infera_core.up.stack import Stack

pytest.importorskip("infera_policies")


def _served_preset(hooks: InferaHooks, **settings: object) -> str:
    app = create_app(ServeSettings(discovery="memory", **settings), hooks)  # type: ignore[arg-type]
    return str(app.state.core.scheduler.default.name)


def test_serve_defaults_to_kv_aware_when_the_policies_plugin_is_installed() -> None:
    hooks = InferaHooks.load(disable=[])
    assert default_policy(hooks.catalog().policies) == "kv-aware"
    assert _served_preset(hooks) == "kv-aware"
    assert _served_preset(hooks, router_policy="round-robin") == "round-robin"


def test_without_the_policies_plugin_serve_and_up_fall_back_to_round_robin() -> None:
    hooks = InferaHooks.load(disable=["policies"])
    assert default_policy(hooks.catalog().policies) == "round-robin"
    assert _served_preset(hooks) == "round-robin"
    assert Stack(UpSettings(workers=1), hooks).policy == "round-robin"
