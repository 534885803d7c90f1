"""Plugin discovery: broken, disabled, strict and explicitly requested plugins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infera_core.discovery.base import DiscoveryRegistry
from infera_core.engines.base import EngineRegistry
from infera_core.errors import PluginError, UnknownNameError
from infera_core.plugin.loader import make_plugin_manager
from infera_core.plugin.spec import hookimpl
from infera_core.testing.fixtures import fake_entry_point, make_hooks
from infera_core.testing.plugins import run_infera, write_distribution
from infera_core.testing.standin_plugin import StandinAdapter

BROKEN_MODULE = """
raise ImportError("infera_broken_demo needs libfoo 9 [not installed]")
"""

ENGINE_MODULE = """
from infera_core.plugin.spec import hookimpl
from infera_core.testing.standin_plugin import StandinAdapter


class Adapter(StandinAdapter):
    name = "twin"
    description = "demo engine"
    package_hint = "pip install nothing"

    def options(self):
        return []


@hookimpl
def infera_register_engines(registry):
    registry.add(Adapter())
"""


class _Engine(StandinAdapter):
    description = "demo"
    package_hint = "pip install demo"

    def __init__(self, name: str) -> None:
        self.name = name


class _EnginePlugin:
    @hookimpl
    def infera_register_engines(self, registry: EngineRegistry) -> None:
        registry.add(_Engine("alpha-engine"))


@pytest.fixture
def broken_dist(tmp_path: Path) -> Path:
    """A folder that, on PYTHONPATH, installs distribution ``infera-broken-demo`` 0.3.0."""
    return write_distribution(
        tmp_path / "site",
        "infera-broken-demo",
        "0.3.0",
        entry_points={"broken": "infera_broken_demo"},
        modules={"infera_broken_demo": BROKEN_MODULE},
    )


# -- in process, through fake entry points ------------------------------------------


def test_broken_plugin_is_reported_and_skipped() -> None:
    hooks = make_hooks(
        ("engines", _EnginePlugin()),
        entry_points=[fake_entry_point("broken", "infera_no_such_module_xyz")],
        installed=False,
    )
    info = hooks.plugins.info("broken")
    assert info is not None and info.status == "failed"
    assert "ModuleNotFoundError" in (info.error or "") and "infera_no_such_module_xyz" in (info.error or "")
    assert info.traceback and "Traceback" in info.traceback
    # the rest still works
    assert hooks.catalog().engines.names() == ["alpha-engine"]


def test_strict_mode_makes_a_broken_plugin_fatal() -> None:
    with pytest.raises(PluginError, match=r"plugin 'broken'.*failed to load: ModuleNotFoundError"):
        make_hooks(
            entry_points=[fake_entry_point("broken", "infera_no_such_module_xyz")],
            installed=False,
            strict=True,
        )


def test_strict_mode_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERA_STRICT_PLUGINS", "1")
    with pytest.raises(PluginError, match="'broken'"):
        make_plugin_manager(eps=[fake_entry_point("broken", "infera_no_such_module_xyz")])


def test_disable_plugins_env_skips_without_importing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERA_DISABLE_PLUGINS", "broken, other")
    monkeypatch.setenv("INFERA_STRICT_PLUGINS", "1")
    plugins = make_plugin_manager(
        eps=[
            fake_entry_point("broken", "infera_no_such_module_xyz"),
            fake_entry_point("core", "infera_core.builtin"),
        ]
    )
    statuses = {i.name: i.status for i in plugins.infos}
    assert statuses == {"core": "ok", "broken": "disabled"}


def test_load_plugins_env_loads_only_those_and_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERA_LOAD_PLUGINS", "wanted")
    plugins = make_plugin_manager(
        eps=[
            fake_entry_point("core", "infera_core.builtin"),
            fake_entry_point("wanted", "infera_core.builtin.commands"),
            fake_entry_point("broken", "infera_no_such_module_xyz"),
        ]
    )
    statuses = {i.name: i.status for i in plugins.infos}
    assert statuses == {"core": "ok", "wanted": "ok", "broken": "disabled"}
    assert plugins.pm.get_plugin("broken") is None


def test_require_returns_registered_object() -> None:
    hooks = make_hooks(("engines", _EnginePlugin()), installed=False)
    assert hooks.require("engine", "alpha-engine").name == "alpha-engine"


def test_require_unknown_name_lists_available_and_failed_plugins() -> None:
    hooks = make_hooks(
        ("engines", _EnginePlugin()),
        entry_points=[fake_entry_point("vllm", "infera_no_such_module_xyz")],
        installed=False,
    )
    with pytest.raises(UnknownNameError) as err:
        hooks.require("engine", "vllm")
    msg = str(err.value)
    assert "unknown engine 'vllm'" in msg
    assert "available: alpha-engine" in msg
    assert "plugin 'vllm'" in msg and "failed to load: ModuleNotFoundError" in msg
    assert "\n" not in msg


def test_require_mentions_disabled_plugins() -> None:
    hooks = make_hooks(
        entry_points=[fake_entry_point("etcdplus", "infera_no_such_module_xyz")],
        installed=False,
        disable=["etcdplus"],
    )
    with pytest.raises(UnknownNameError, match=r"none installed.*disabled by INFERA_DISABLE_PLUGINS"):
        hooks.require("discovery_backend", "etcdplus")


def test_require_policy_kinds_and_presets() -> None:
    hooks = make_hooks(installed=False)
    with pytest.raises(UnknownNameError, match="unknown scorer 'kv-overlap'"):
        hooks.require("scorer", "kv-overlap")
    with pytest.raises(UnknownNameError, match="unknown policy preset 'fast'"):
        hooks.require("preset", "fast")


def test_failing_register_hook_names_the_plugin() -> None:
    class Exploding:
        @hookimpl
        def infera_register_discovery_backends(self, registry: DiscoveryRegistry) -> None:
            raise RuntimeError("bad config in plugin")

    hooks = make_hooks(("exploding", Exploding()), installed=False)
    with pytest.raises(PluginError, match="plugin 'exploding' failed in infera_register_discovery_backends"):
        hooks.catalog()


# -- the real infera-run, with a broken distribution on PYTHONPATH ----------------


def test_plugins_command_reports_broken_distribution(broken_dist: Path) -> None:
    proc = run_infera(["plugins", "--json"], pythonpath=[broken_dist])
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    broken = rows["broken"]
    assert broken["status"] == "failed"
    assert broken["distribution"] == "infera-broken-demo" and broken["version"] == "0.3.0"
    assert "needs libfoo 9" in broken["error"]
    assert rows["vllm"]["status"] == "ok"
    # the table form shows it too
    table = run_infera(["plugins"], pythonpath=[broken_dist], env={"COLUMNS": "250"})
    assert table.returncode == 0 and "broken" in table.stdout and "failed" in table.stdout
    assert "[not installed]" in table.stdout


@pytest.mark.parametrize("how", ["flag", "env"])
def test_strict_plugins_exits_with_one_clear_line(broken_dist: Path, how: str) -> None:
    if how == "flag":
        proc = run_infera(["--strict-plugins", "plugins"], pythonpath=[broken_dist])
    else:
        proc = run_infera(["plugins"], pythonpath=[broken_dist], env={"INFERA_STRICT_PLUGINS": "1"})
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "'broken'" in lines[0] and "infera-broken-demo" in lines[0] and "needs libfoo 9" in lines[0]
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_disabled_broken_plugin_does_not_trip_strict_mode(broken_dist: Path) -> None:
    proc = run_infera(
        ["--strict-plugins", "plugins", "--json", "--all"],
        pythonpath=[broken_dist],
        env={"INFERA_DISABLE_PLUGINS": "broken"},
    )
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert rows["broken"]["status"] == "disabled" and "error" not in rows["broken"]


def test_version_lists_plugin_versions(broken_dist: Path) -> None:
    proc = run_infera(["--version"], pythonpath=[broken_dist])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("infera-core ")
    assert "infera-broken-demo 0.3.0 (broken: failed)" in lines
    assert any(line.startswith("infera-vllm ") and "(vllm: ok)" in line for line in lines)


def test_duplicate_engine_across_distributions_fails_naming_both(tmp_path: Path) -> None:
    site = tmp_path / "site"
    write_distribution(site, "infera-twin-a", "1.0", {"twin_a": "twin_a_mod"}, {"twin_a_mod": ENGINE_MODULE})
    write_distribution(site, "infera-twin-b", "1.0", {"twin_b": "twin_b_mod"}, {"twin_b_mod": ENGINE_MODULE})
    proc = run_infera(["engines"], pythonpath=[site])
    assert proc.returncode == 1
    line = proc.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert "engine 'twin' is registered twice" in line and "'twin_a'" in line and "'twin_b'" in line


def test_explicitly_requested_broken_engine_is_fatal_naming_the_failure(broken_dist: Path) -> None:
    proc = run_infera(["worker", "broken", "--model", "m"], pythonpath=[broken_dist])
    assert proc.returncode == 1
    # the failed plugin's load warning (with its traceback) is logged first, as designed;
    # the fatal error itself is the last line, alone
    error = proc.stderr.strip().splitlines()[-1]
    assert error.startswith("infera-run: error: unknown engine 'broken'; available: ")
    assert "sim" in error and "vllm" in error
    assert "plugin 'broken' (distribution infera-broken-demo) failed to load" in error and "libfoo 9" in error


@pytest.mark.parametrize(
    ("args", "unknown"),
    [
        (["--router-policy", "least-busy"], "unknown policy preset 'least-busy'"),
        (["--discovery", "consul"], "unknown discovery backend 'consul'"),
    ],
)
def test_serve_unknown_name_names_the_plugin_that_failed_to_load(
    broken_dist: Path, args: list[str], unknown: str
) -> None:
    """The name may have come from the broken plugin: the one error line says so."""
    proc = run_infera(["serve", "--discovery", "memory", "--port", "0", *args], pythonpath=[broken_dist])
    assert proc.returncode != 0
    err = proc.stderr.strip().splitlines()[-1]  # the error line (a load warning may precede it)
    assert err.startswith("infera-run: error:") and unknown in err, proc.stderr
    assert "plugin 'broken' (distribution infera-broken-demo) failed to load" in err, proc.stderr
    assert "needs libfoo 9" in err, proc.stderr


def test_router_config_unknown_scorer_names_the_plugin_that_failed_to_load(
    broken_dist: Path, tmp_path: Path
) -> None:
    config = tmp_path / "router.yaml"
    config.write_text("scorers: [{name: least-busy}]\n")
    proc = run_infera(["serve", "--discovery", "memory", "--router-config", str(config)], [broken_dist])
    assert proc.returncode != 0
    err = proc.stderr.strip().splitlines()[-1]
    assert "unknown scorer 'least-busy'" in err, proc.stderr
    assert "plugin 'broken' (distribution infera-broken-demo) failed to load" in err, proc.stderr
