"""Moved to :mod:`infera_core.engines.transfer`; this re-export stays for one release."""

from infera_core.engines.transfer import (
    TransferConnector,
    TransferConnectorRegistry,
    TransferHooks,
    TransferPlan,
    check_kv_role,
    check_one_sided_mixed,
    connectors_for,
    extra_config,
    find_connector,
    one_pd_child,
    parse_user_config,
    resolve_plan,
)

__all__ = [
    "TransferConnector",
    "TransferConnectorRegistry",
    "TransferHooks",
    "TransferPlan",
    "check_kv_role",
    "check_one_sided_mixed",
    "connectors_for",
    "extra_config",
    "find_connector",
    "one_pd_child",
    "parse_user_config",
    "resolve_plan",
]
