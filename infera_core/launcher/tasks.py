"""What the model serves (``WorkerRecord.tasks``), learned from the running engine's routes.

vLLM mounts its routes by the model's supported tasks (``vllm/entrypoints/launchers/api_server/
routers.py``: the generate routes only for ``generate``, ``/v1/embeddings`` for ``embed``,
``/score`` and ``/rerank`` when scoring works, ``/classify`` for ``classify``) and lists them in
its FastAPI ``/openapi.json`` (the sim serves the same list). The launcher reads it once
before registering, so a router never sends an embedding request to a generate-only worker or
a chat request to an embedding model. An adapter that knows better says so itself
(``RecordFields.tasks``: SGLang mounts every route for every model, its ``--is-embedding``
says which kind it is; vLLM's ``--convert``); an engine without ``/openapi.json`` (vLLM
``--disable-fastapi-docs``) is recorded as ``generate``.
"""

from __future__ import annotations

import logging

import httpx

from infera_core.engines.base import EngineAdapter, RunningEngine
from infera_core.worker import WorkerRecord, tasks_of_routes

log = logging.getLogger("infera.launcher")


async def served_tasks(client: httpx.AsyncClient, url: str) -> list[str]:
    """The tasks the engine at ``url`` serves by its ``/openapi.json``; [] when it does not say."""
    try:
        r = await client.get(f"{url}/openapi.json", timeout=10.0)
        paths = r.json().get("paths") if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return []
    return tasks_of_routes(paths) if isinstance(paths, dict) else []


async def with_served_tasks(
    adapter: EngineAdapter, engine: RunningEngine, record: WorkerRecord
) -> WorkerRecord:
    """``record`` with ``tasks`` as the engine serves them. What the adapter declared
    (``RecordFields.tasks``: an engine that mounts every route whatever its model, as SGLang)
    stands; else the engine's routes, when it lists them."""
    if adapter.record_fields(engine.ctx).tasks is not None:
        return record
    tasks = await served_tasks(engine.client, engine.url)
    if not tasks or tasks == record.tasks:
        return record
    log.info("worker %s: the engine serves %s", record.worker_id, ", ".join(tasks))
    return record.model_copy(update={"tasks": tasks})
