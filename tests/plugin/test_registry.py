from __future__ import annotations

import pytest

from infera_core.discovery.base import DiscoveryRegistry
from infera_core.engines.base import EngineRegistry
from infera_core.errors import DuplicateNameError, PluginError
from infera_core.plugin.spec import hookimpl
from infera_core.scheduling.registry import PolicyRegistry
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.standin_plugin import StandinAdapter


class _Adapter(StandinAdapter):
    def __init__(self, name: str) -> None:
        self.name = name


class _PluginA:
    @hookimpl
    def infera_register_engines(self, registry: EngineRegistry) -> None:
        registry.add(_Adapter("twin"))


class _PluginB:
    @hookimpl
    def infera_register_engines(self, registry: EngineRegistry) -> None:
        registry.add(_Adapter("twin"))


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


class _NameOnly:
    name = "hollow"


class _HollowPlugin:
    @hookimpl
    def infera_register_engines(self, registry: EngineRegistry) -> None:
        registry.add(_NameOnly())  # type: ignore[arg-type]


class _HollowDiscoveryPlugin:
    @hookimpl
    def infera_register_discovery_backends(self, registry: DiscoveryRegistry) -> None:
        registry.add(_NameOnly())  # type: ignore[arg-type]


class _NotAPolicyPlugin:
    @hookimpl
    def infera_register_policies(self, registry: PolicyRegistry) -> None:
        registry.add(_NameOnly())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("plugin", "needle"),
    [
        (
            _HollowPlugin(),
            "engine 'hollow' that does not implement EngineAdapter: missing build_launch, description",
        ),
        (
            _HollowDiscoveryPlugin(),
            "discovery backend 'hollow' that does not implement DiscoveryFactory: missing create",
        ),
        (_NotAPolicyPlugin(), "registered a _NameOnly as a policy: register infera_core.scheduling.types"),
    ],
)
def test_an_incomplete_object_fails_at_registration_naming_the_plugin_and_what_is_missing(
    plugin: object, needle: str
) -> None:
    hooks = make_hooks(("hollow_plugin", plugin), installed=False)
    with pytest.raises(PluginError) as err:
        hooks.catalog()
    assert "plugin 'hollow_plugin'" in str(err.value) and needle in str(err.value)
