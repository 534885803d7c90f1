from __future__ import annotations

import pytest

from infera_core.errors import DuplicateNameError
from infera_core.hookspecs import hookimpl
from infera_core.registry import EngineRegistry
from infera_core.testing.fixtures import make_hooks


class _Adapter:
    def __init__(self, name: str) -> None:
        self.name = name


class _PluginA:
    @hookimpl
    def infera_register_engines(self, registry: EngineRegistry) -> None:
        registry.add(_Adapter("twin"))  # type: ignore[arg-type]


class _PluginB:
    @hookimpl
    def infera_register_engines(self, registry: EngineRegistry) -> None:
        registry.add(_Adapter("twin"))  # type: ignore[arg-type]


def test_duplicate_engine_names_fail_naming_both_plugins() -> None:
    hooks = make_hooks(("alpha", _PluginA()), ("beta", _PluginB()), installed=False)
    with pytest.raises(DuplicateNameError) as err:
        hooks.catalog()
    assert "'alpha'" in str(err.value) and "'beta'" in str(err.value)


def test_registry_records_owner() -> None:
    hooks = make_hooks(("alpha", _PluginA()), installed=False)
    engines = hooks.catalog().engines
    assert engines.names() == ["twin"]
    assert engines.owner_of("twin") == "alpha"
