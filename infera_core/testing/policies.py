"""Building blocks for policy tests and benchmarks: a policy registry with chosen plugins'
policies, and the record of a worker that publishes KV events (no process behind it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from infera_core.builtin.policies import register_defaults
from infera_core.scheduling.registry import PolicyRegistry
from infera_core.worker import KvEventsInfo, WorkerRecord


def policy_registry(*registrars: Callable[[PolicyRegistry], None]) -> PolicyRegistry:
    """A registry with core's filters and pickers, then each of ``registrars``'s policies
    (e.g. ``infera_policies.kv.register_kv``), without loading any plugin."""
    registry = PolicyRegistry()
    register_defaults(registry)
    for register in registrars:
        register(registry)
    return registry


def kv_worker_record(worker_id: str, block_size: int, *, model: str = "m", **fields: Any) -> WorkerRecord:
    """The record of sim worker ``worker_id`` (at ``http://<worker_id>``) that publishes vLLM
    KV events with ``block_size``-token blocks; ``fields`` sets other record fields."""
    return WorkerRecord(
        worker_id=worker_id,
        url=f"http://{worker_id}",
        model=model,
        engine="sim",
        kv_events=KvEventsInfo(endpoint="tcp://x:1", format="vllm", block_size=block_size),
        **fields,
    )
