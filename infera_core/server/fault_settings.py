"""Faulty-worker settings (hang detection, waiting for an upstream connection), shared by
``infera-run serve`` and ``infera-run up``; what each does is in ``docs/how-to/operate.md``."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class FaultSettings(BaseModel):
    """One pydantic field per flag / ``INFERA_*`` variable / config key."""

    pool_timeout: float = Field(
        10.0,
        gt=0,
        description="Seconds a request may wait for a free upstream connection at --upstream-connections"
        " before it fails with 503.",
    )
    hang_timeout: float = Field(
        20.0,
        ge=0,
        description="A worker that answered nothing for this long while requests wait on it is hung:"
        " breaker opened, its requests retried elsewhere (0: off).",
    )
    hang_factor: float = Field(
        4.0,
        gt=0,
        description="The hang threshold also grows to this many times the fleet's typical first-byte latency.",
    )
    migration_limit: int = Field(
        1,
        ge=0,
        description="Times a stream that breaks after its first byte (worker killed, closed, hung,"
        " drained) is continued on another worker of its model (0: never; per model: the router"
        " config's models.<name>.migration_limit). See docs/how-to/migration.md.",
    )
    drain_grace: float = Field(
        5.0,
        ge=0,
        description="Seconds a draining worker keeps its streams before the router moves them to"
        " another worker of its model (0: it keeps them until they end or its --drain-timeout cuts them).",
    )

    def faults_of(self) -> dict[str, Any]:
        """These fields as keyword arguments (``up`` hands them to its server's settings)."""
        return {name: getattr(self, name) for name in FaultSettings.model_fields}
