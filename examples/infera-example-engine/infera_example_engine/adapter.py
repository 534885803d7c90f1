"""Runs echo-engine as an Infera worker. Never imports the engine: it builds the engine's
command line and talks to it over HTTP."""

from __future__ import annotations

import shutil

from infera_core.engines.base import (
    EngineOption,
    FlagAlias,
    LaunchContext,
    LaunchSpec,
    RecordFields,
    RunningEngine,
)
from infera_core.engines.support import AdapterBase, bracket_host, free_ports, metrics_in_flight
from infera_core.errors import EngineError
from infera_core.worker import KvEventsInfo, Role

IN_FLIGHT = ("echo:requests_running", "echo:requests_waiting")
"""echo-engine's Prometheus gauges of the requests it serves and queues."""

MANAGED = {
    "--model": "--model-path",
    "--listen-host": "infera's --host",
    "--listen-port": "infera's --port",
    "--served-name": "infera's --model",
    "--kv-events-endpoint": "infera's KV events (always on)",
}
"""echo-engine flags Infera sets itself: refused after --, naming the flag to use instead."""


def launch_ports(ctx: LaunchContext) -> dict[str, int]:
    """The ports of this launch, picked once and kept in ctx.ports (never on the adapter)."""
    if "kv" not in ctx.ports:
        wanted = int(ctx.options.get("kv_events_port") or 0)
        ctx.ports["kv"] = wanted or free_ports(ctx)[0]
    return ctx.ports


class EchoAdapter(AdapterBase):
    name = "echo"
    description = "echo-engine: a toy OpenAI-compatible server (example engine plugin)"
    package_hint = "pip install echo-engine"
    engine_options = (
        EngineOption("block_size", int, 16, "KV block size in tokens (echo-engine --kv-block-size)."),
        EngineOption("slots", int, 4, "Requests echo-engine serves at once (its --parallel)."),
        EngineOption("kv_events_port", int, 0, "Port for echo-engine's KV events (0: a free one)."),
        EngineOption("engine_binary", str, "echo-engine", "The echo-engine executable."),
    )
    aliases = {
        "--listen-port": FlagAlias("--port"),
        "--kv-block-size": FlagAlias("--block-size"),
        "--parallel": FlagAlias("--slots"),
        "--enable-kv-events": FlagAlias("", takes_value=False),  # Infera always turns them on
    }
    managed_flags = MANAGED

    def launch(self, ctx: LaunchContext) -> LaunchSpec:
        """Called by build_launch once no flag of MANAGED came after --."""
        if ctx.role is not Role.MIXED:
            raise EngineError(f"echo-engine has no prefill/decode split: drop --role {ctx.role.value}")
        block = int(ctx.options.get("block_size") or 16)
        if block <= 0:
            raise EngineError(f"--block-size {block}: must be a positive number of tokens")
        binary = str(ctx.options.get("engine_binary") or "echo-engine")
        argv = [
            shutil.which(binary) or binary,
            "--model", ctx.served_path,
            "--served-name", ctx.model,
            "--listen-host", ctx.host,
            "--listen-port", str(ctx.port),
            "--parallel", str(int(ctx.options.get("slots") or 4)),
            "--kv-block-size", str(block),
            "--kv-events-endpoint", f"tcp://*:{launch_ports(ctx)['kv']}",
            *ctx.engine_args,
        ]  # fmt: skip
        return LaunchSpec(argv=argv, env={"ECHO_LOG_FORMAT": "plain"})

    def record_fields(self, ctx: LaunchContext) -> RecordFields:
        kv = KvEventsInfo(
            endpoint=f"tcp://{bracket_host(ctx.advertise_host)}:{launch_ports(ctx)['kv']}",
            format="vllm",  # echo-engine publishes vLLM's ZMQ event format
            block_size=int(ctx.options.get("block_size") or 16),
        )
        return RecordFields(kv_events=kv, labels={"engine": "echo"})

    async def in_flight(self, engine: RunningEngine) -> int | None:
        return await metrics_in_flight(engine.client, engine.url, IN_FLIGHT)

    async def served_block_size(self, engine: RunningEngine) -> int | None:
        response = await engine.client.get(f"{engine.url}/v1/engine_info")
        size = response.json().get("block_size") if response.status_code == 200 else None
        return size if isinstance(size, int) else None
