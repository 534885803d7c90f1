"""The ``standin`` engine adapter (test-only): runs :mod:`infera_core.testing.standin_engine`.

Register it in-process with ``make_hooks(("standin", "infera_core.testing.standin_plugin"))``,
or for subprocess tests put :func:`infera_core.testing.fleet.standin_dist_dir` on
``PYTHONPATH`` (a dist-info whose entry point names this module).
"""

from __future__ import annotations

import sys

from infera_core.engines.base import (
    EngineOption,
    EngineRegistry,
    LaunchContext,
    LaunchSpec,
    RecordFields,
    RunningEngine,
)
from infera_core.engines.support import AdapterBase, metrics_in_flight
from infera_core.plugin.spec import hookimpl


class StandinAdapter(AdapterBase):
    name = "standin"
    description = (
        "Test stand-in engine: a tiny HTTP server with /health, /metrics and a slow /v1/completions."
    )
    package_hint = "pip install infera-core (the stand-in ships in infera_core.testing)"
    engine_options = (
        EngineOption("delay", float, 0.0, "Seconds each completion takes."),
        EngineOption("die_after", float, None, "Crash (exit code 3) after this many seconds."),
        EngineOption("fail_health", bool, False, "Health checks always fail.", is_flag=True),
        EngineOption("fail_health_after", float, None, "Health checks fail after this many seconds."),
        EngineOption("engine_binary", str, None, "Run this executable instead of Python (tests)."),
    )

    def launch(self, ctx: LaunchContext) -> LaunchSpec:
        opts = ctx.options
        python = opts.get("engine_binary") or ctx.engine_python or sys.executable
        argv = [
            python,
            "-m",
            "infera_core.testing.standin_engine",
            "--host",
            ctx.host,
            "--port",
            str(ctx.port),
        ]
        argv += ["--delay", str(opts.get("delay") or 0.0)]
        if opts.get("die_after") is not None:
            argv += ["--die-after", str(opts["die_after"])]
        if opts.get("fail_health"):
            argv.append("--fail-health")
        if opts.get("fail_health_after") is not None:
            argv += ["--fail-health-after", str(opts["fail_health_after"])]
        return LaunchSpec(argv=argv + list(ctx.engine_args), env={"PYTHONUNBUFFERED": "1"})

    def record_fields(self, ctx: LaunchContext) -> RecordFields:
        return RecordFields(engine_version="0.0-standin", labels={"standin": "1"})

    async def in_flight(self, engine: RunningEngine) -> int | None:
        return await metrics_in_flight(engine.client, engine.url, ["vllm:num_requests_running"])


@hookimpl
def infera_register_engines(registry: EngineRegistry) -> None:
    registry.add(StandinAdapter())
