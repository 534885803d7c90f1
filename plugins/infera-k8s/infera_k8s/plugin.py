"""Entry point of the ``infera-k8s`` distribution (hook implementations)."""

from __future__ import annotations

from infera_core.discovery.base import DiscoveryRegistry
from infera_core.plugin.spec import hookimpl


@hookimpl
def infera_register_discovery_backends(registry: DiscoveryRegistry) -> None:
    from infera_k8s.factory import KubernetesDiscoveryFactory

    registry.add(KubernetesDiscoveryFactory())
