"""Core scheduling defaults (filled by the scheduler work)."""

from __future__ import annotations

from infera_core.hookspecs import hookimpl
from infera_core.registry import PolicyRegistry


@hookimpl
def infera_register_policies(registry: PolicyRegistry) -> None:
    return None
