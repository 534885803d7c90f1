"""The worker record the vLLM adapter publishes for a launch (helper of the PD tests)."""

from __future__ import annotations

from infera_vllm.adapter import VllmAdapter

from infera_core.engines.base import LaunchContext
from infera_core.testing.contracts import launch_record
from infera_core.worker import WorkerRecord


def adapter_record(ctx: LaunchContext) -> WorkerRecord:
    """What a launcher registers for ``ctx``: its URL, role and the adapter's record fields,
    without KV events (the PD tests route on roles, not on cache state)."""
    return launch_record(VllmAdapter(), ctx, kv_events=None)
