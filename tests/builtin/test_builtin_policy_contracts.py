"""Core's own filters and pickers pass the same contract suites third-party plugins use."""

from __future__ import annotations

import pytest

from infera_core.builtin.policies import register_defaults
from infera_core.errors import UnknownNameError
from infera_core.scheduling.registry import PolicyRegistry
from infera_core.testing.contracts import FilterContract, policy_suites

_CORE = PolicyRegistry()
register_defaults(_CORE)


globals().update(
    policy_suites(
        _CORE, "filter:model", "filter:health", "filter:role", "picker:max-score", "picker:round-robin"
    )
)


class TestRoleFilterWithRoles(FilterContract):
    factory = _CORE.factory("filter", "role")
    params = {"roles": ["prefill"]}


def test_core_registers_the_documented_defaults() -> None:
    documented = {"filter:health", "filter:model", "filter:role", "picker:max-score", "picker:round-robin"}
    assert documented <= set(_CORE.names())
    assert "round-robin" in _CORE.preset_names()


def test_policy_suites_make_one_named_suite_per_policy() -> None:
    suites = policy_suites(_CORE, "filter:model", "picker:round-robin")
    assert list(suites) == ["TestModelFilter", "TestRoundRobinPicker"]
    assert issubclass(suites["TestModelFilter"], FilterContract)
    assert suites["TestRoundRobinPicker"].factory is _CORE.factory("picker", "round-robin")
    with pytest.raises(UnknownNameError):
        policy_suites(_CORE, "scorer:no-such-scorer")
