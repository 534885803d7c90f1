"""The examples in docs/ are real code: they run, and the plugin they add works."""

from __future__ import annotations

import re
import types
from pathlib import Path

from click.testing import CliRunner

from infera_core.cli import build_cli
from infera_core.engines.base import LaunchSpec
from infera_core.engines.transfer import TransferPlan, resolve_plan
from infera_core.testing.contracts import EngineAdapterContract, ScorerContract, sample_launch_context
from infera_core.testing.fixtures import make_hooks
from infera_core.worker import Role

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _blocks(doc: str) -> list[str]:
    """Python code blocks of ``doc``, without the bare hook signatures."""
    blocks = re.findall(r"```python[^\n]*\n(.*?)```", (DOCS / doc).read_text(), re.S)
    return [b for b in blocks if not re.fullmatch(r"def \w+\(.*\) -> None\n", b)]


def _exec_as_module(name: str, blocks: list[str]) -> types.ModuleType:
    module = types.ModuleType(name)
    for block in blocks:
        exec(compile(block, f"docs/{name}", "exec"), module.__dict__)
    return module


def test_hook_reference_examples_make_a_working_plugin() -> None:
    plugin = _exec_as_module("reference/hooks.md", _blocks("reference/hooks.md"))
    hooks = make_hooks(("core-commands", "infera_core.builtin.commands"), ("docs", plugin), installed=False)
    catalog = hooks.catalog()
    assert catalog.provides()["docs"] == {
        "engines": ["echo"],
        "kv_event_decoders": ["echo"],
        "pd_transports": ["echo-pd"],
        "policies": ["scorer:idle"],
        "discovery_backends": ["consul"],
        "tokenizers": ["sentencepiece"],
        "request_transports": ["pigeon"],
        "kv_event_transports": ["file"],
        "transfer_connectors": ["echo:pipe"],
        "presets": ["idle-first"],
    }
    consul = catalog.discovery.get("consul")
    assert consul.settings_model.__name__ == "ConsulSettings"  # type: ignore[attr-defined]
    help_text = CliRunner().invoke(build_cli(hooks), ["serve", "--help"], terminal_width=200).output
    assert "--consul-url" in help_text and "INFERA_CONSUL_URL" in help_text

    class EchoContract(EngineAdapterContract):
        adapter = catalog.engines.get("echo")

    suite = EchoContract()
    for check in ("test_satisfies_protocol", "test_identity", "test_options", "test_build_launch"):
        getattr(suite, check)()

    spec = LaunchSpec(argv=["echo-engine"])
    hooks.mutate_engine_launch(sample_launch_context(), spec)
    assert spec.env == {"HF_HOME": "/var/cache/hf"}

    # the transfer connector builds the echo engine's plan; the amend hook edits vLLM's nixl plans
    launch = sample_launch_context()
    launch.role, launch.hooks = Role.PREFILL, hooks
    plan = resolve_plan(launch, "echo", (), chosen="pipe", user={"kv_buffer_device": "cpu"})
    assert plan.config == {
        "kv_buffer_device": "cpu",
        "kv_connector": "PipeConnector",
        "kv_role": "kv_prefill",
    }
    assert plan.pd is not None and plan.pd.protocol == "echo-pd"
    nixl = TransferPlan(
        engine="vllm", role=Role.DECODE, connector="nixl", config={"kv_connector": "NixlConnector"}
    )
    hooks.amend_kv_transfer(launch, nixl)
    assert nixl.config["kv_connector_extra_config"] == {"backends": ["UCX"]} and "UCX_TLS" in nixl.env

    result = CliRunner().invoke(build_cli(hooks), ["echo-stats"])
    assert result.exit_code == 0 and result.output == "echo\n"


def test_plugin_guide_examples_run() -> None:
    # the policy tutorial's blocks (the engine tutorial's import their own package, installed by
    # tests/guide/test_plugin_guide.py, which follows both tutorials)
    guide = _exec_as_module("tutorials/policy-plugin.md", _blocks("tutorials/policy-plugin.md"))
    hooks = make_hooks(("example_policy", guide), installed=False)
    preset = hooks.catalog().policies.preset("example-labelled")
    assert preset.profile.scorers[0].name == "prefer-label"
    assert hooks.require("scorer", "prefer-label").params is not None
    guide.test_preset_is_registered(make_hooks)  # the guide's own fixture-based test
    assert issubclass(guide.TestPreferLabelContract, ScorerContract)


def test_transport_how_to_example_registers_its_transport() -> None:
    page = "how-to/write-a-transport-or-backend.md"
    plugin = _exec_as_module(page, _blocks(page))
    hooks = make_hooks(("carrier", plugin), installed=False)
    assert hooks.catalog().provides()["carrier"]["request_transports"] == ["carrier"]
