"""TensorRT-LLM's ``trtllm-serve``: ``infera-run worker trtllm --model-path <dir> [-- flags]``.

Flags checked against ``tensorrt_llm/commands/serve.py`` (click command ``serve``: positional
``MODEL``, ``--host``, ``--port``, ``--tensor_parallel_size``/``--tp_size``,
``--pipeline_parallel_size``/``--pp_size``, ``--backend``; the ``trtllm-serve`` group runs
``serve`` by default). Routes in ``tensorrt_llm/serve/openai_server.py``: ``GET /health``
(200 once the LLM is built), ``/prometheus/metrics`` (mounted when the LLM API option
``return_perf_metrics`` is on) with the gauges ``trtllm_num_requests_running`` /
``trtllm_num_requests_waiting`` named in ``tensorrt_llm/metrics/collector.py``, and
``/metrics``: a JSON list of iteration stats (``numActiveRequests``, ``numQueuedRequests``;
filled when ``enable_iter_perf_stats`` is on). trtllm-serve names the served model after the
model directory; it does not check the ``model`` of a request.

KV events (on unless ``--no-kv-events``): TRT-LLM hands them out on ``POST /kv_cache_events``
instead of publishing them, so the launcher polls that (:meth:`TrtllmAdapter.poll_kv_events`)
and publishes them on the record's ZMQ ports; see :mod:`infera_openai.trtllm_kv` for the LLM
API settings Infera adds and :mod:`infera_openai.trtllm_events` for the format.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from infera_core.engines.base import (
    EngineOption,
    FlagAlias,
    LaunchContext,
    LaunchSpec,
    RecordFields,
    RunningEngine,
)
from infera_core.engines.support import AdapterBase
from infera_openai import trtllm_kv
from infera_openai.base import OpenAIServerAdapter, get_text, locate_binary, positive

SERVE = "trtllm-serve"

MANAGED_FLAGS = {
    "--host": "infera's --host",
    "--port": "infera's --port",
    "--tensor_parallel_size": "--tp",
    "--tp_size": "--tp",
    "--pipeline_parallel_size": "--pp",
    "--pp_size": "--pp",
}

ALIASES: Mapping[str, FlagAlias] = {
    "--tensor_parallel_size": FlagAlias("--tp"),
    "--tp_size": FlagAlias("--tp"),
    "--pipeline_parallel_size": FlagAlias("--pp"),
    "--pp_size": FlagAlias("--pp"),
}
"""trtllm-serve's spellings of what Infera manages (``python -m infera.engine.trtllm``, after ``--``)."""

OPTIONS: tuple[EngineOption, ...] = (
    EngineOption("tp", int, 1, "Tensor-parallel size (trtllm-serve --tp_size)."),
    EngineOption("pp", int, 1, "Pipeline-parallel size (trtllm-serve --pp_size)."),
    EngineOption("trtllm_serve", str, None, f"Path of {SERVE} [default: the one on PATH]."),
    EngineOption(
        "kv_events",
        bool,
        True,
        "Turn on TRT-LLM's KV events (kv_cache_config.event_buffer_max_size in the --config YAML Infera "
        "writes) and publish them for the router; --no-kv-events: none (routed by approximate prefix).",
        is_flag=True,
    ),
    EngineOption(
        "block_size",
        int,
        32,
        "KV cache block (kv_cache_config.tokens_per_block), also the router's hashing block.",
    ),
    EngineOption("kv_events_port", int, 0, "Port the launcher publishes the KV events on (0: a free one)."),
    EngineOption(
        "transfer_backend",
        str,
        "DEFAULT",
        "KV transfer for --role prefill/decode (cache_transceiver_config.backend): DEFAULT, UCX, NIXL or MPI.",
    ),
)


class TrtllmAdapter(OpenAIServerAdapter):
    """Launches and watches one ``trtllm-serve serve`` (the LLM API's OpenAI server)."""

    name = "trtllm"
    description = "TensorRT-LLM trtllm-serve (OpenAI server of the LLM API); KV events polled by the launcher"
    default_policy = "kv-aware"
    package_hint = "pip install tensorrt_llm (its trtllm-serve script)"
    metrics_path = "/prometheus/metrics"
    running_metrics = ("trtllm_num_requests_running",)
    waiting_metrics = ("trtllm_num_requests_waiting",)
    managed_flags = MANAGED_FLAGS
    aliases = ALIASES
    engine_options = OPTIONS

    def build_launch(self, ctx: LaunchContext) -> LaunchSpec:
        """Any role: prefill/decode workers serve TRT-LLM's disaggregated protocol (trtllm-disagg)."""
        return AdapterBase.build_launch(self, ctx)

    def launch(self, ctx: LaunchContext) -> LaunchSpec:
        serve = locate_binary(ctx.options.get("trtllm_serve"), SERVE, "--trtllm-serve", self.package_hint)
        config = trtllm_kv.write_config(ctx) if trtllm_kv.needs_config(ctx) else None
        return LaunchSpec(argv=[serve, "serve", *self.engine_flags(ctx, config)])

    def engine_flags(self, ctx: LaunchContext, config: str | None = None) -> list[str]:
        """Every ``trtllm-serve serve`` argument (pure: no probe); ``config`` is the path of the
        LLM API YAML Infera wrote (:func:`trtllm_kv.write_config`), replacing the user's own."""
        flags = [ctx.served_path, "--host", ctx.host, "--port", str(ctx.port)]
        flags += ["--tp_size", str(positive(ctx, "tp", "--tp"))]
        pp = positive(ctx, "pp", "--pp")
        if pp != 1:
            flags += ["--pp_size", str(pp)]
        if config is None:
            return flags + list(ctx.engine_args)
        config_flags, rest = trtllm_kv.config_flags(ctx, config)
        return flags + config_flags + rest

    def record_fields(self, ctx: LaunchContext) -> RecordFields:
        """KV events published by the launcher (format ``trtllm``) unless turned off; the PD
        protocol for a prefill/decode role."""
        fields = super().record_fields(ctx) if not trtllm_kv.enabled(ctx) else RecordFields()
        if trtllm_kv.enabled(ctx):
            fields.kv_events = trtllm_kv.kv_events_info(ctx)
        fields.pd = trtllm_kv.pd_info(ctx)
        return fields

    async def poll_kv_events(self, engine: RunningEngine) -> list[bytes]:
        """The events ``POST /kv_cache_events`` hands out (the launcher publishes them)."""
        return await trtllm_kv.poll(engine)

    async def load(self, engine: RunningEngine) -> dict[str, float] | None:
        """The Prometheus gauges, else the newest iteration stats of ``/metrics``."""
        from_prometheus = await super().load(engine)
        if from_prometheus is not None:
            return from_prometheus
        text = await get_text(engine, "/metrics")
        if text is None:
            return None
        try:
            stats: Any = json.loads(text)
        except ValueError:
            return None
        if not isinstance(stats, list) or not stats or not isinstance(stats[-1], dict):
            return None
        last = stats[-1]
        try:
            return {
                "running": float(last.get("numActiveRequests", 0)),
                "waiting": float(last.get("numQueuedRequests", 0)),
            }
        except (TypeError, ValueError):
            return None
