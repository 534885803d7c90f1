"""Core discovery backends: etcd, memory, static file."""

from __future__ import annotations

from infera_core.discovery.base import DiscoveryRegistry
from infera_core.plugin.spec import hookimpl


@hookimpl
def infera_register_discovery_backends(registry: DiscoveryRegistry) -> None:
    from infera_core.discovery.etcd import EtcdDiscoveryFactory
    from infera_core.discovery.memory import MemoryDiscoveryFactory
    from infera_core.discovery.static import StaticDiscoveryFactory

    registry.add(EtcdDiscoveryFactory())
    registry.add(MemoryDiscoveryFactory())
    registry.add(StaticDiscoveryFactory())
