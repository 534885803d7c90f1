"""LoRA adapters loaded or unloaded while the engine runs (vLLM's ``/v1/load_lora_adapter``
with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``; SGLang's ``/load_lora_adapter``): the launcher
re-reads the engine's ``/v1/models`` at most every :attr:`LoraRefresh.every` seconds while it
monitors the engine, and republishes its record when the adapter list changed, so routers
start (or stop) routing the adapter's name to it."""

from __future__ import annotations

import logging
import time

import httpx

from infera_core.launcher.card import lora_adapters, served_models
from infera_core.worker import WorkerRecord

log = logging.getLogger("infera.launcher")


class LoraRefresh:
    """The record's ``lora_adapters`` kept equal to the engine's (see the module docstring)."""

    __slots__ = ("_due", "every")

    def __init__(self, every: float = 30.0) -> None:
        self.every = every
        """Seconds between two reads of the engine's ``/v1/models``."""
        self._due = time.monotonic() + every

    async def changed(
        self, client: httpx.AsyncClient, url: str, record: WorkerRecord | None
    ) -> WorkerRecord | None:
        """``record`` with the engine's adapters when they differ from its own (None: unchanged,
        not due, or the engine did not answer)."""
        now = time.monotonic()
        if record is None or now < self._due:
            return None
        self._due = now + self.every
        served = await served_models(client, url)
        if not served:  # no answer this time: keep what is published
            return None
        adapters = lora_adapters(served)
        if adapters == record.lora_adapters:
            return None
        log.info(
            "worker %s: LoRA adapters now %s (were %s)",
            record.worker_id,
            ", ".join(adapters) or "none",
            ", ".join(record.lora_adapters) or "none",
        )
        return record.model_copy(update={"lora_adapters": adapters})
