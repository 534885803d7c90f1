"""`infera-run engines` and `infera-run policies`: empty registries and a populated catalog."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from click.testing import CliRunner
from pydantic import BaseModel, Field

from infera_core.cli import build_cli
from infera_core.engines.base import (
    EngineOption,
    EngineRegistry,
    LaunchContext,
    LaunchSpec,
    RecordFields,
    RunningEngine,
)
from infera_core.plugin.hooks import InferaHooks
from infera_core.plugin.spec import hookimpl
from infera_core.request import RequestContext
from infera_core.scheduling.config import PluginRef, ProfileConfig, ScorerRef
from infera_core.scheduling.registry import PolicyRegistry
from infera_core.scheduling.types import Endpoint, Picker, PolicyFactory, SchedulerDeps, Scorer
from infera_core.testing.fixtures import fake_entry_point, make_hooks


class DemoAdapter:
    name = "demo-engine"
    description = "A demo engine for CLI tests."
    package_hint = "pip install demo-engine"

    def options(self) -> Sequence[EngineOption]:
        return [
            EngineOption("block_size", int, 16, "KV block size in tokens."),
            EngineOption("kv_events", bool, False, "Publish KV events.", is_flag=True),
            EngineOption("dtype", str, "auto", "Weights dtype.", choices=("auto", "bf16")),
        ]

    def build_launch(self, ctx: LaunchContext) -> LaunchSpec:
        return LaunchSpec(argv=["demo-engine", "--port", str(ctx.port)])

    def record_fields(self, ctx: LaunchContext) -> RecordFields:
        return RecordFields()

    async def is_ready(self, engine: RunningEngine) -> bool:
        return True

    async def in_flight(self, engine: RunningEngine) -> int | None:
        return None


class LoadParams(BaseModel):
    cap: int = Field(32, ge=1, description="In-flight count that scores 0.")


class LoadScorer(Scorer):
    name = "demo-load"

    def __init__(self, cap: int) -> None:
        self.cap = cap

    def score(self, ctx: RequestContext, candidates: Sequence[Endpoint]) -> list[float]:
        return [max(0.0, 1.0 - ep.in_flight / self.cap) for ep in candidates]


class FirstPicker(Picker):
    name = "demo-first"

    def pick(self, ctx: RequestContext, candidates: Sequence[Endpoint], scores: Sequence[float]) -> Endpoint:
        return candidates[0]


def _build_scorer(params: LoadParams, deps: SchedulerDeps) -> Scorer:
    return LoadScorer(params.cap)


def _build_picker(params: None, deps: SchedulerDeps) -> Picker:
    return FirstPicker()


class DemoPlugin:
    @hookimpl
    def infera_register_engines(self, registry: EngineRegistry) -> None:
        registry.add(DemoAdapter())

    @hookimpl
    def infera_register_policies(self, registry: PolicyRegistry) -> None:
        registry.add(PolicyFactory("demo-load", "scorer", _build_scorer, LoadParams, "Prefer idle workers."))
        registry.add(PolicyFactory("demo-first", "picker", _build_picker, None, "First candidate."))
        registry.add_preset(
            "demo-preset",
            ProfileConfig(
                scorers=[ScorerRef(name="demo-load", weight=2.0, params={"cap": 8})],
                picker=PluginRef(name="demo-first"),
            ),
            "Load-only demo.",
        )


COMMANDS_ONLY = ("core-commands", "infera_core.builtin.commands")


def _invoke(hooks: InferaHooks, *args: str) -> Any:
    # wide enough that rich does not wrap table cells
    result = CliRunner().invoke(build_cli(hooks), list(args), env={"COLUMNS": "250"}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def test_engines_and_policies_with_empty_registries() -> None:
    hooks = make_hooks(COMMANDS_ONLY, installed=False)
    assert json.loads(_invoke(hooks, "engines", "--json").stdout) == []
    assert json.loads(_invoke(hooks, "policies", "--json").stdout) == {
        "filters": [],
        "scorers": [],
        "pickers": [],
        "presets": [],
    }
    assert "no engine adapters installed" in _invoke(hooks, "engines").stdout
    assert "no presets installed" in _invoke(hooks, "policies").stdout


def test_engines_lists_adapter_owner_and_options() -> None:
    hooks = make_hooks(COMMANDS_ONLY, ("demo", DemoPlugin()), installed=False)
    rows = json.loads(_invoke(hooks, "engines", "--json").stdout)
    assert [r["name"] for r in rows] == ["demo-engine"]
    row = rows[0]
    assert row["plugin"] == "demo" and row["description"] == "A demo engine for CLI tests."
    assert row["package_hint"] == "pip install demo-engine"
    opts = {o["name"]: o for o in row["options"]}
    assert opts["block_size"] == {
        "name": "block_size",
        "flag": "--block-size",
        "env": "INFERA_BLOCK_SIZE",
        "type": "int",
        "default": 16,
        "is_flag": False,
        "choices": None,
        "help": "KV block size in tokens.",
    }
    assert opts["kv_events"]["is_flag"] is True and opts["dtype"]["choices"] == ["auto", "bf16"]
    table = " ".join(_invoke(hooks, "engines").stdout.split())
    assert "demo-engine" in table and "--block-size [INFERA_BLOCK_SIZE]" in table and "[default: 16]" in table


def test_policies_lists_kinds_schemas_and_presets() -> None:
    hooks = make_hooks(COMMANDS_ONLY, ("demo", DemoPlugin()), installed=False)
    data = json.loads(_invoke(hooks, "policies", "--json").stdout)
    (scorer,) = data["scorers"]
    assert scorer["name"] == "demo-load" and scorer["plugin"] == "demo"
    assert scorer["description"] == "Prefer idle workers."
    cap = scorer["params_schema"]["properties"]["cap"]
    assert cap["default"] == 32 and cap["minimum"] == 1 and cap["type"] == "integer"
    (picker,) = data["pickers"]
    assert picker["name"] == "demo-first" and picker["params_schema"] is None
    (preset,) = data["presets"]
    assert preset["name"] == "demo-preset" and preset["description"] == "Load-only demo."
    assert preset["profile"]["scorers"] == [{"name": "demo-load", "params": {"cap": 8}, "weight": 2.0}]
    table = " ".join(_invoke(hooks, "policies").stdout.split())
    assert "demo-load" in table and "cap: integer=32" in table and "demo-preset" in table


def test_catalog_commands_warn_about_failed_plugins() -> None:
    hooks = make_hooks(
        COMMANDS_ONLY,
        ("demo", DemoPlugin()),
        entry_points=[fake_entry_point("ghost", "infera_no_such_module_xyz")],
        installed=False,
    )
    result = CliRunner().invoke(build_cli(hooks), ["engines", "--json"])
    assert result.exit_code == 0
    assert [r["name"] for r in json.loads(result.stdout)] == ["demo-engine"]
    assert "plugin 'ghost'" in result.stderr and "failed to load" in result.stderr
