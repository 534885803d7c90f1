"""The worker record the vLLM adapter publishes for a launch (helper of the PD tests)."""

from __future__ import annotations

from infera_vllm.adapter import VllmAdapter

from infera_core.engines.base import LaunchContext
from infera_core.worker import WorkerRecord


def adapter_record(ctx: LaunchContext) -> WorkerRecord:
    """What a launcher registers for ``ctx``: its URL, role and the adapter's record fields."""
    fields = VllmAdapter().record_fields(ctx)
    return WorkerRecord(
        worker_id=ctx.worker_id,
        url=ctx.url,
        model=ctx.model,
        engine="vllm",
        role=ctx.role,
        dp_rank=fields.dp_rank,
        dp_size=fields.dp_size,
        pd=fields.pd,
    )
