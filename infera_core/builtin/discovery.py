"""Core discovery backends (filled by the fleet work)."""

from __future__ import annotations

from infera_core.hookspecs import hookimpl
from infera_core.registry import DiscoveryRegistry


@hookimpl
def infera_register_discovery_backends(registry: DiscoveryRegistry) -> None:
    return None
