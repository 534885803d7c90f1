"""The ``kubernetes`` backend's factory: light to import (every ``infera-run`` start builds
the catalog); the client (lightkube, ~0.3 s to import) loads only when the backend is used."""

from __future__ import annotations

from typing import TYPE_CHECKING

from infera_core.discovery.base import DiscoverySettings
from infera_k8s.settings import KubernetesSettings

if TYPE_CHECKING:
    from infera_k8s.discovery import KubernetesDiscovery


class KubernetesDiscoveryFactory:
    name = "kubernetes"
    description = "Worker pods picked by a label selector (list + watch); launchers publish on their pod."
    settings_model = KubernetesSettings

    def create(self, settings: DiscoverySettings) -> KubernetesDiscovery:
        from infera_k8s.discovery import KubernetesDiscovery

        options = getattr(settings, "options", None)  # the backend settings seam (flags + env)
        own = options.get(KubernetesSettings) if options is not None else KubernetesSettings()
        return KubernetesDiscovery(own, settings.connect_timeout)
