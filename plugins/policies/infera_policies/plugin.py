"""Hook implementations of the infera-policies plugin.

Each policy family lives in its own module with a ``register_<family>(registry)``
function; add a family by adding one call below.
"""

from __future__ import annotations

from infera_core.plugin.spec import hookimpl
from infera_core.scheduling.registry import PolicyRegistry


@hookimpl
def infera_register_policies(registry: PolicyRegistry) -> None:
    from infera_policies.basic import register_basic

    register_basic(registry)

    from infera_policies.approx_prefix import register_approx_prefix
    from infera_policies.kv import register_kv
    from infera_policies.predicted import register_predicted

    register_kv(registry)
    register_approx_prefix(registry)
    register_predicted(registry)
