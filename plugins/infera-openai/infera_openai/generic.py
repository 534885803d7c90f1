"""Any OpenAI-compatible server: ``infera-run worker openai --command 'my-server --port {port} …'``.

The command is split like a shell would (no shell runs it) and each word's placeholders are
filled: ``{host}``, ``{port}`` (required: the server must listen where Infera routes),
``{model}`` (served name) and ``{model_path}``. Readiness is ``GET --health-path`` answering 200
(``/v1/models`` by default: every OpenAI server has it); in-flight comes from the Prometheus
gauges named by ``--running-metric``/``--waiting-metric``, when given.
"""

from __future__ import annotations

import shlex
import string

from infera_core.engines.base import EngineOption, LaunchContext, LaunchSpec, RunningEngine
from infera_core.engines.support import http_ok, metrics_sum
from infera_core.errors import EngineError
from infera_openai.base import OpenAIServerAdapter, get_text

PLACEHOLDERS = ("host", "port", "model", "model_path")

OPTIONS: tuple[EngineOption, ...] = (
    EngineOption(
        "command",
        str,
        None,
        "The server's command line, with {host} {port} {model} {model_path} filled in "
        "(e.g. 'python -m my_server --port {port} --model {model_path}'); {port} is required.",
    ),
    EngineOption("health_path", str, "/v1/models", "Path answering 200 once the server serves."),
    EngineOption("metrics_path", str, "/metrics", "Path of the server's Prometheus metrics."),
    EngineOption(
        "running_metric",
        str,
        None,
        "Prometheus gauge(s) of running requests, comma-separated (e.g. vllm:num_requests_running).",
    ),
    EngineOption(
        "waiting_metric",
        str,
        None,
        "Prometheus gauge(s) of queued requests, comma-separated (e.g. vllm:num_requests_waiting).",
    ),
)


def _names(raw: object) -> tuple[str, ...]:
    return tuple(n.strip() for n in str(raw or "").split(",") if n.strip())


def _path(raw: object, flag: str) -> str:
    path = str(raw or "")
    if not path.startswith("/"):
        raise EngineError(f"{flag} {path!r}: must start with /")
    return path


def render_command(ctx: LaunchContext) -> list[str]:
    """The ``--command`` words with the placeholders filled (one error line for bad input)."""
    raw = ctx.options.get("command")
    if not raw:
        raise EngineError("the openai engine needs --command '<server command with {port}>'")
    try:
        words = shlex.split(str(raw))
    except ValueError as exc:
        raise EngineError(f"--command: cannot split it like a shell ({exc})") from None
    values = {"host": ctx.host, "port": str(ctx.port), "model": ctx.model, "model_path": ctx.served_path}
    used: set[str] = set()
    out: list[str] = []
    for word in words:
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(word) if f is not None]
        except ValueError as exc:
            raise EngineError(
                f"--command word {word!r}: {exc} (write {{{{ and }}}} for literal braces)"
            ) from None
        unknown = [f for f in fields if f not in values]
        if unknown:
            raise EngineError(
                f"--command: unknown placeholder {{{unknown[0]}}} (use {', '.join('{' + p + '}' for p in PLACEHOLDERS)})"
            )
        used.update(fields)
        out.append(word.format(**values))
    if "port" not in used:
        raise EngineError(
            "--command must contain {port}: the server has to listen on the port Infera routes to"
        )
    return out


class GenericOpenAIAdapter(OpenAIServerAdapter):
    """Launches any command that serves the OpenAI API and watches it over HTTP."""

    name = "openai"
    description = "Any OpenAI-compatible server started by --command (placeholders {host} {port} {model})"
    package_hint = "install the server your --command runs"
    engine_options = OPTIONS

    def launch(self, ctx: LaunchContext) -> LaunchSpec:
        argv = render_command(ctx) + list(ctx.engine_args)
        _path(ctx.options.get("health_path") or "/v1/models", "--health-path")
        _path(ctx.options.get("metrics_path") or "/metrics", "--metrics-path")
        return LaunchSpec(argv=argv)

    async def is_ready(self, engine: RunningEngine) -> bool:
        path = str(engine.ctx.options.get("health_path") or "/v1/models")
        return await http_ok(engine.client, engine.url + path)

    async def load(self, engine: RunningEngine) -> dict[str, float] | None:
        running = _names(engine.ctx.options.get("running_metric"))
        waiting = _names(engine.ctx.options.get("waiting_metric"))
        if not running and not waiting:
            return None
        text = await get_text(engine, str(engine.ctx.options.get("metrics_path") or "/metrics"))
        if text is None:
            return None
        run = metrics_sum(text, running) if running else None
        wait = metrics_sum(text, waiting) if waiting else None
        if run is None and wait is None:
            return None
        return {"running": run or 0.0, "waiting": wait or 0.0}
