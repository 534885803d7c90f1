"""Prefill/decode disaggregation on the server: see :mod:`.dispatch` and ``docs/explanation/pd.md``."""

from __future__ import annotations

from typing import Any

from infera_core.plugin.hooks import Catalog
from infera_core.scheduling.pd import build_pd_scheduler
from infera_core.scheduling.types import SchedulerDeps
from infera_core.server.pd.dispatch import PdDispatcher
from infera_core.server.pd.legs import LegFailed
from infera_core.server.pd.metrics import PdMetrics

__all__ = ["LegFailed", "PdDispatcher", "PdMetrics", "build_pd"]


def build_pd(
    core: Any, raw_config: dict[str, Any] | None, catalog: Catalog, deps: SchedulerDeps, max_inflight: int = 0
) -> PdDispatcher:
    """The PD path of one server (config errors raise ``ConfigError`` here, at start-up)."""
    scheduler, config = build_pd_scheduler(
        core.table,
        raw_config,
        catalog.policies,
        deps,
        catalog.pd_transports,
        max_inflight=max_inflight,
        observe=core.metrics.decided,
        notify=getattr(core.scheduler, "_notify", None),
    )
    metrics = PdMetrics(core.metrics.registry, lambda: list(core.table.by_id.values()))
    return PdDispatcher(core, scheduler, catalog.pd_transports, metrics, config)
