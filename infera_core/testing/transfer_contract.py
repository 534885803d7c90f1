"""Contract tests for KV transfer connectors (``infera_register_transfer_connectors``).

Subclass :class:`TransferConnectorContract` in your plugin's tests, set ``connector`` (and
``user`` when your connector needs a config), and pytest collects the checks::

    class TestMyConnector(TransferConnectorContract):
        connector = MyConnector()
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from infera_core.engines.base import LaunchContext
from infera_core.engines.transfer import TransferConnector, TransferPlan
from infera_core.errors import EngineError
from infera_core.testing.engine_contract import sample_launch_context
from infera_core.worker import Role


class TransferConnectorContract:
    """A transfer connector builds a well-formed plan for both PD roles, once per launch."""

    connector: ClassVar[Any]
    """An instance of your connector (what ``infera_register_transfer_connectors`` adds)."""
    user: ClassVar[dict[str, Any]] = {}
    """The user's ``--kv-transfer-config`` the checks build with ({} for none)."""
    options: ClassVar[dict[str, Any]] = {"tp": 2}
    """Adapter option values in the launch context (``tp`` > 1 exercises per-rank ports)."""

    def launch_context(self, role: Role) -> LaunchContext:
        """The context ``build`` gets; override to set what your engine needs."""
        return sample_launch_context(role=role, options=dict(self.options))

    def plan(self, role: Role) -> TransferPlan:
        plan = self.connector.build(self.launch_context(role), json.loads(json.dumps(self.user)))
        assert isinstance(plan, TransferPlan), f"build returned {type(plan).__name__}, not a TransferPlan"
        return plan

    def test_satisfies_protocol(self) -> None:
        assert isinstance(self.connector, TransferConnector), "connector lacks TransferConnector members"
        assert self.connector.engine and self.connector.name, "engine and name must be non-empty"
        assert isinstance(self.connector.native, tuple), "native must be a tuple of the engine's spellings"

    def test_builds_a_plan_per_pd_role(self) -> None:
        for role in (Role.PREFILL, Role.DECODE):
            plan = self.plan(role)
            assert plan.role is role and plan.engine == self.connector.engine
            assert plan.connector == self.connector.name
            assert plan.pd is not None and plan.pd.protocol, f"{role.value}: no PD protocol for the router"
            json.dumps(plan.config)  # rendered as --kv-transfer-config JSON
            json.dumps(plan.pd.params)  # published in the worker record
            assert all(isinstance(f, str) for f in plan.flags), "flags must be strings"
            assert all(isinstance(k, str) and isinstance(v, str) for k, v in plan.env.items()), (
                "env: str → str"
            )

    def test_prefill_and_decode_speak_the_same_protocol(self) -> None:
        prefill, decode = self.plan(Role.PREFILL), self.plan(Role.DECODE)
        assert prefill.pd is not None and decode.pd is not None
        assert prefill.pd.protocol == decode.pd.protocol, "a PD pair must speak one protocol"

    def test_a_contradicting_role_is_one_line(self) -> None:
        """A user ``kv_role`` of the other side is refused with one line (or ignored: no config)."""
        for role, other in ((Role.PREFILL, "kv_consumer"), (Role.DECODE, "kv_producer")):
            ctx = self.launch_context(role)
            try:
                plan = self.connector.build(ctx, {**self.user, "kv_role": other})
            except EngineError as exc:
                assert "\n" not in str(exc), "the error must be one line"
                continue
            assert plan.config.get("kv_role") != other, f"{role.value} worker launched with kv_role {other}"
