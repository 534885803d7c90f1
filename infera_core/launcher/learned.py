"""What the launcher learns from the running engine before it registers: its real block size,
what its model serves (:mod:`infera_core.launcher.tasks`)."""

from __future__ import annotations

import logging

from infera_core.engines.base import EngineAdapter, RunningEngine, ServedBlockSize
from infera_core.launcher.tasks import with_served_tasks
from infera_core.launcher.waits import quietly
from infera_core.worker import WorkerRecord

log = logging.getLogger("infera.launcher")


async def with_served_block_size(
    adapter: EngineAdapter, engine: RunningEngine, record: WorkerRecord
) -> WorkerRecord:
    """``record`` with ``kv_events.block_size`` set to what the engine reports it uses.

    Unchanged when the adapter cannot tell (no :class:`ServedBlockSize`, or no answer).
    """
    if record.kv_events is None or not isinstance(adapter, ServedBlockSize):
        return record
    served = await quietly(adapter.served_block_size(engine), default=None)
    if served is None or served <= 0 or served == record.kv_events.block_size:
        return record
    log.info(
        "worker %s: the engine uses KV block size %d (not %d); recorded",
        record.worker_id,
        served,
        record.kv_events.block_size,
    )
    kv = record.kv_events.model_copy(update={"block_size": served})
    return record.model_copy(update={"kv_events": kv})


async def learned_record(adapter: EngineAdapter, engine: RunningEngine, record: WorkerRecord) -> WorkerRecord:
    """``record`` with what the running engine says: its block size and its tasks."""
    record = await with_served_block_size(adapter, engine, record)
    return await with_served_tasks(adapter, engine, record)
