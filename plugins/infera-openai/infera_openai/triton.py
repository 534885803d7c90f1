"""Triton's OpenAI-compatible frontend: ``infera-run worker triton --model <name> --model-path <repo>``.

Flags checked against ``python/openai/openai_frontend/main.py`` of triton-inference-server/server
(argparse: ``--model-repository`` (required), ``--host``, ``--openai-port`` (default 9000),
``--tokenizer``, ``--backend``, ``--enable-kserve-frontends`` (off, so its KServe ports 8000/8001
stay closed)); routes in ``frontend/fastapi/routers/observability.py``: ``GET /health/ready``
(200 once the engine is ready) and ``GET /metrics`` (Triton's Prometheus text:
``nv_inference_pending_request_count`` per model, and the backend's gauges — TensorRT-LLM's
``nv_trt_llm_request_metrics{request_type="active"|"waiting"}``, vLLM's
``vllm:num_requests_running``/``vllm:num_requests_waiting``). The frontend is a script, not a
console command: it runs with the Triton container's Python. Triton serves each model under its
repository name, so ``--model`` must name a model of the repository.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping

from infera_core.engines.base import EngineOption, FlagAlias, LaunchContext, LaunchSpec, RunningEngine
from infera_core.engines.support import ENGINE_PYTHON_ENV
from infera_core.errors import EngineError
from infera_openai.base import OpenAIServerAdapter, get_text, labelled_sum

FRONTEND = "/opt/tritonserver/python/openai/openai_frontend/main.py"
"""Where the Triton container keeps the OpenAI frontend."""

MANAGED_FLAGS = {
    "--model-repository": "--model-path",
    "--host": "infera's --host",
    "--openai-port": "infera's --port",
}

ALIASES: Mapping[str, FlagAlias] = {
    "--model-repository": FlagAlias("--model-path"),
    "--openai-port": FlagAlias("--port"),
}
"""The frontend's spellings of what Infera manages (``python -m infera.engine.triton``, after ``--``)."""

OPTIONS: tuple[EngineOption, ...] = (
    EngineOption(
        "triton_frontend",
        str,
        FRONTEND,
        "Path of the OpenAI frontend's main.py (run with --engine-python, else python3 on PATH).",
    ),
)


class TritonAdapter(OpenAIServerAdapter):
    """Launches and watches Triton's OpenAI frontend (an in-process Triton server)."""

    name = "triton"
    description = (
        "Triton Inference Server, OpenAI-compatible frontend (openai_frontend/main.py); no KV events"
    )
    package_hint = "run inside the Triton container (tritonserver Python package and the openai frontend)"
    health_path = "/health/ready"
    managed_flags = MANAGED_FLAGS
    aliases = ALIASES
    engine_options = OPTIONS

    def launch(self, ctx: LaunchContext) -> LaunchSpec:
        frontend = str(ctx.options.get("triton_frontend") or FRONTEND)
        if not os.path.isfile(frontend):
            raise EngineError(f"--triton-frontend {frontend}: no such file ({self.package_hint})")
        python = ctx.engine_python or os.environ.get(ENGINE_PYTHON_ENV) or shutil.which("python3")
        if not python:
            raise EngineError("no python3 to run the Triton frontend: pass --engine-python")
        return LaunchSpec(argv=[python, frontend, *self.engine_flags(ctx)])

    def engine_flags(self, ctx: LaunchContext) -> list[str]:
        """Every frontend flag (pure: no probe)."""
        return [
            "--model-repository",
            ctx.served_path,
            "--host",
            ctx.host,
            "--openai-port",
            str(ctx.port),
            *ctx.engine_args,
        ]

    async def load(self, engine: RunningEngine) -> dict[str, float] | None:
        """Running: the backend's active requests; waiting: Triton's pending queue + the backend's."""
        text = await get_text(engine, self.metrics_path)
        if text is None:
            return None
        running = [
            labelled_sum(text, "nv_trt_llm_request_metrics", request_type="active"),
            labelled_sum(text, "vllm:num_requests_running"),
        ]
        waiting = [
            labelled_sum(text, "nv_inference_pending_request_count"),
            labelled_sum(text, "nv_trt_llm_request_metrics", request_type="waiting"),
            labelled_sum(text, "vllm:num_requests_waiting"),
        ]
        if all(v is None for v in running + waiting):
            return None
        return {"running": sum(v or 0.0 for v in running), "waiting": sum(v or 0.0 for v in waiting)}
