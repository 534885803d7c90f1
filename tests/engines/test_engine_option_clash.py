"""An engine option spelled like one of Infera's launcher flags is refused at catalog load.

The plugin is installed the way a user installs one (a dist-info with an ``infera`` entry
point on the path), and every command that builds an engine's flags says the same one line:
``worker --help``, ``worker <engine> --help``, ``workers``, ``up --engine`` and the flat
``python -m infera.engine.<name>`` form.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from infera_core.cli.alias import flat_main_for
from infera_core.engines.base import EngineOption, EngineRegistry
from infera_core.errors import PluginError
from infera_core.plugin.hooks import InferaHooks
from infera_core.plugin.spec import hookimpl
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.fleet import CliResult, in_process_cli
from infera_core.testing.plugins import write_distribution
from infera_core.testing.standin_plugin import StandinAdapter

PLUGIN = textwrap.dedent(
    """
    from infera_core.engines.base import EngineOption
    from infera_core.plugin.spec import hookimpl
    from infera_core.testing.standin_plugin import StandinAdapter


    class ClashAdapter(StandinAdapter):
        name = "clashy"

        def options(self):
            return [*super().options(), EngineOption("port", int, 8000, "The engine's own port.")]


    @hookimpl
    def infera_register_engines(registry):
        registry.add(ClashAdapter())
    """
)

EXPECTED = (
    "plugin 'clash' (distribution infera-clash-engine) registered engine 'clashy' with options "
    "named like Infera's own flags: --port (Infera's --port)"
)


@pytest.fixture
def run_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., CliResult]:
    """Runs ``infera-run`` (or a flat ``main``) in this process with the clashing plugin installed."""
    entry_points = {"clash": "infera_clash_testplugin"}
    site = write_distribution(
        tmp_path, "infera-clash-engine", "0.0.0", entry_points, {"infera_clash_testplugin": PLUGIN}
    )
    return in_process_cli(site, "clash", monkeypatch, capsys)


@pytest.mark.parametrize(
    "args",
    [
        ["worker", "--help"],
        ["worker", "clashy", "--help"],
        ["worker", "clashy", "--model", "m", "--port", "9"],
        ["workers", "--static-file", "/nonexistent.json"],
        ["up", "--engine", "clashy", "--model", "m"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_each_command_refuses_the_plugin_in_one_line(
    run_cli: Callable[..., CliResult], args: list[str]
) -> None:
    r = run_cli(*args)
    output = r.stdout + r.stderr
    assert r.code != 0
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    assert lines[0].startswith("infera-run: error: ") and EXPECTED in lines[0]
    assert "ctx.port" in lines[0] and "Traceback" not in output


def test_the_flat_form_refuses_it_too(run_cli: Callable[..., CliResult]) -> None:
    r = run_cli("--model", "m", "--port", "30000", entry=flat_main_for("clashy"))
    output = r.stdout + r.stderr
    assert r.code != 0
    assert output.strip().splitlines() == [output.strip()], output
    assert output.startswith("infera.engine.clashy: error: ") and EXPECTED in output


class _BackendFlagClash(StandinAdapter):
    """An option spelled like a flag a discovery plugin adds (infera-nats' --nats-url)."""

    name = "nats-clash"

    def options(self) -> Sequence[EngineOption]:
        return [*super().options(), EngineOption("nats_url", str, None, "Where the engine's NATS is.")]


class _BackendClashPlugin:
    @hookimpl
    def infera_register_engines(self, registry: EngineRegistry) -> None:
        registry.add(_BackendFlagClash())


def test_flags_added_by_backend_plugins_count_too() -> None:
    hooks = make_hooks(("backend-clash", _BackendClashPlugin()))
    nats = hooks.plugins.info("nats")
    if nats is None or nats.status != "ok":
        pytest.skip("infera-nats is not installed")
    with pytest.raises(PluginError, match=r"engine 'nats-clash' .*--nats-url \(Infera's --nats-url\)"):
        hooks.catalog()


def test_the_builtin_engines_all_load() -> None:
    engines = InferaHooks.load().catalog().engines.names()
    for name in ("vllm", "sglang", "atom", "sim", "llamacpp", "tgi", "trtllm", "triton", "openai"):
        assert name in engines
