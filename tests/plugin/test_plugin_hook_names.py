"""A misspelt hook implementation is a plugin load error naming the plugin and the hook."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infera_core.engines.base import EngineRegistry
from infera_core.errors import PluginError
from infera_core.plugin.spec import hookimpl
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.plugins import run_infera, write_distribution

TYPO_MODULE = """
from infera_core.plugin.spec import hookimpl


class Adapter:
    name = "typo-engine"


@hookimpl
def infera_register_engine(registry):  # the hook is infera_register_engines
    registry.add(Adapter())
"""


@pytest.fixture
def typo_dist(tmp_path: Path) -> Path:
    return write_distribution(
        tmp_path / "site",
        "infera-typo-demo",
        "0.1.0",
        entry_points={"typo": "infera_typo_demo"},
        modules={"infera_typo_demo": TYPO_MODULE},
    )


def test_misspelt_hook_is_reported_and_the_plugin_skipped(typo_dist: Path) -> None:
    proc = run_infera(["plugins", "--json"], pythonpath=[typo_dist])
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert rows["typo"]["status"] == "failed"
    error = rows["typo"]["error"]
    assert "'infera_register_engine'" in error and "did you mean 'infera_register_engines'" in error
    assert rows["sim"]["status"] == "ok"  # the others still load
    assert "plugin 'typo'" in proc.stderr and "infera_register_engine" in proc.stderr  # logged


def test_misspelt_hook_is_fatal_with_strict_plugins(typo_dist: Path) -> None:
    proc = run_infera(["--strict-plugins", "engines"], pythonpath=[typo_dist])
    assert proc.returncode == 1
    [line] = proc.stderr.strip().splitlines()
    assert "plugin 'typo' (distribution infera-typo-demo)" in line
    assert "'infera_register_engine' matches no infera hook" in line


class _Typo:
    @hookimpl
    def infera_register_engine(self, registry: EngineRegistry) -> None:
        raise AssertionError("never called")


class _Optional:
    @hookimpl(optionalhook=True)
    def infera_something_new(self) -> None:
        """A hook of a newer core: optional, so an older core accepts the plugin."""


def test_an_explicitly_registered_plugin_with_a_misspelt_hook_raises() -> None:
    with pytest.raises(PluginError, match=r"plugin 'typo' failed to load: .*'infera_register_engine'"):
        make_hooks(("typo", _Typo()), installed=False)


def test_optional_hooks_are_allowed() -> None:
    hooks = make_hooks(("optional", _Optional()), installed=False)
    assert hooks.plugins.info("optional") is not None
