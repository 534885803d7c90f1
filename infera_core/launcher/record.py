"""The worker record a launcher registers for one launch of an engine."""

from __future__ import annotations

from collections.abc import Mapping

from infera_core.engines.base import EngineAdapter, LaunchContext, LaunchSpec
from infera_core.worker import Status, WorkerRecord


def launch_record(
    adapter: EngineAdapter,
    ctx: LaunchContext,
    spec: LaunchSpec | None = None,
    engine: str | None = None,
    labels: Mapping[str, str] | None = None,
) -> WorkerRecord:
    """``adapter.record_fields(ctx)`` with the launch's identity: its URL, model and role, the
    engine's name (``engine``, else the adapter's), the version the launch found (``spec``) and
    the operator's ``labels`` over the adapter's."""
    fields = adapter.record_fields(ctx)
    return WorkerRecord(
        worker_id=ctx.worker_id,
        url=ctx.url,
        model=ctx.model,
        engine=engine or adapter.name,
        engine_version=fields.engine_version or (spec.engine_version if spec is not None else None),
        role=ctx.role,
        status=Status.ACTIVE,
        dp_rank=fields.dp_rank if fields.dp_rank is not None else ctx.dp_rank,
        dp_size=fields.dp_size,
        kv_events=fields.kv_events,
        pd=fields.pd,
        labels={**fields.labels, **(labels or {})},
        **({"tasks": list(fields.tasks)} if fields.tasks else {}),
        priority=fields.priority,
    )
