"""Core's own filters and pickers pass the same contract suites third-party plugins use."""

from __future__ import annotations

from infera_core.builtin.policies import register_defaults
from infera_core.scheduling.registry import PolicyRegistry
from infera_core.testing.contracts import FilterContract, PickerContract

_CORE = PolicyRegistry()
register_defaults(_CORE)


class TestModelFilter(FilterContract):
    factory = _CORE.factory("filter", "model")


class TestHealthFilter(FilterContract):
    factory = _CORE.factory("filter", "health")


class TestRoleFilter(FilterContract):
    factory = _CORE.factory("filter", "role")


class TestRoleFilterWithRoles(FilterContract):
    factory = _CORE.factory("filter", "role")
    params = {"roles": ["prefill"]}


class TestMaxScorePicker(PickerContract):
    factory = _CORE.factory("picker", "max-score")


class TestRoundRobinPicker(PickerContract):
    factory = _CORE.factory("picker", "round-robin")


def test_core_registers_the_documented_defaults() -> None:
    documented = {"filter:health", "filter:model", "filter:role", "picker:max-score", "picker:round-robin"}
    assert documented <= set(_CORE.names())
    assert "round-robin" in _CORE.preset_names()
