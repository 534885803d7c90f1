"""What the OpenAI-server engines share: no KV events, HTTP readiness, in-flight from metrics.

Each engine here (llama.cpp, TGI, Triton, any OpenAI server; TensorRT-LLM overrides the KV
event and role parts) serves the OpenAI API itself and publishes no KV cache events, so its
worker record has ``kv_events=None`` and
``infera-run up`` routes it with the ``approximate-prefix`` preset (cache affinity from the
router's own decisions) unless ``--router-policy`` says otherwise. Nothing here imports an
engine.
"""

from __future__ import annotations

from typing import ClassVar

from infera_core.engines.base import LaunchContext, LaunchSpec, RecordFields, RunningEngine
from infera_core.engines.support import AdapterBase, metrics_sum
from infera_core.errors import EngineError
from infera_core.worker import Role

ROUTING_DEFAULT = "approximate-prefix"
"""The preset ``infera-run up`` picks for these engines (they publish no KV events)."""


class OpenAIServerAdapter(AdapterBase):
    """Base of the engines in this plugin: subclasses give the command and the engine's names.

    ``health_path`` answers 200 once the engine serves; ``running_metrics`` and
    ``waiting_metrics`` are the engine's Prometheus gauges read from ``metrics_path`` (engines
    with other formats override :meth:`load`). ``default_policy`` is the routing preset
    ``infera-run up`` uses for them.
    """

    default_policy: ClassVar[str] = ROUTING_DEFAULT
    metrics_path: ClassVar[str] = "/metrics"
    running_metrics: ClassVar[tuple[str, ...]] = ()
    """The engine's Prometheus gauges of requests running (summed over labels)."""
    waiting_metrics: ClassVar[tuple[str, ...]] = ()
    """The engine's Prometheus gauges of requests queued."""

    def build_launch(self, ctx: LaunchContext) -> LaunchSpec:
        if ctx.role is not Role.MIXED:
            raise EngineError(
                f"--role {ctx.role.value}: the {self.name} engine has no prefill/decode transport "
                "in Infera; run it as a mixed worker (drop --role)"
            )
        return super().build_launch(ctx)

    def record_fields(self, ctx: LaunchContext) -> RecordFields:
        """No KV events (``kv_events=None``), no PD: the router cannot see this engine's cache."""
        return RecordFields(labels={"kv-events": "none"})

    async def load(self, engine: RunningEngine) -> dict[str, float] | None:
        """``{"running": …, "waiting": …}`` from the engine's own metric names (None: unknown)."""
        if not self.running_metrics:
            return None
        text = await get_text(engine, self.metrics_path)
        if text is None:
            return None
        running = metrics_sum(text, self.running_metrics)
        if running is None:
            return None
        return {"running": running, "waiting": metrics_sum(text, self.waiting_metrics) or 0.0}

    async def in_flight(self, engine: RunningEngine) -> int | None:
        """Running + waiting requests (drain stops the engine at 0)."""
        load = await self.load(engine)
        return None if load is None else round(load["running"] + load["waiting"])


async def get_text(engine: RunningEngine, path: str) -> str | None:
    """The body of ``GET <engine>/<path>`` when it answers 200, else None."""
    import httpx

    try:
        response = await engine.client.get(engine.url + path)
    except httpx.HTTPError:
        return None
    return response.text if response.status_code == 200 else None


def positive(ctx: LaunchContext, option: str, flag: str) -> int:
    """An integer option that must be ≥ 1 (one error line otherwise)."""
    raw = ctx.options.get(option)
    value = 1 if raw in (None, "") else int(raw)
    if value < 1:
        raise EngineError(f"{flag} {value}: must be at least 1")
    return value


def locate_binary(given: object, name: str, flag: str, package_hint: str) -> str:
    """``given`` (the adapter's path option) or ``name`` on ``PATH``; one error line otherwise."""
    import os
    import shutil

    if given:
        path = str(given)
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise EngineError(f"{flag} {path}: no such executable")
        return path
    found = shutil.which(name)
    if found is None:
        raise EngineError(f"{name} not found on PATH: {package_hint} (or pass {flag} PATH)")
    return found


def labelled_sum(text: str, name: str, **labels: str) -> float | None:
    """Sum the samples of Prometheus metric ``name`` whose labels include ``labels``
    (``request_type="active"``); None when no sample matches."""
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    total = 0.0
    seen = False
    for line in text.splitlines():
        if not line.startswith(name) or line[len(name) : len(name) + 1] not in ("{", " "):
            continue
        head, _, value = line.rpartition("}") if "{" in line else ("", "", line[len(name) :])
        if any(w not in head for w in wanted):
            continue
        try:
            total += float(value.split()[0])
        except (ValueError, IndexError):
            continue
        seen = True
    return total if seen else None
