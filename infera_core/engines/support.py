"""Helpers shared by engine adapters (vLLM, SGLang, ATOM…); no engine is imported here.

* :func:`locate_engine` — which interpreter / console script runs the engine, and a cheap
  probe of that interpreter (is the engine package there, which version) done in a short
  subprocess, so the launcher never imports the engine itself.
* :func:`free_ports` — allocate free loopback ports, optionally consecutive (engines that
  offset a port per DP rank need ``base + rank`` free).
* :func:`reject_managed_flags` — refuse engine flags after ``--`` that Infera sets itself.
* :class:`AdapterBase` — an adapter's names, options and aliases as class attributes, and a
  ``build_launch`` that refuses the managed flags before the subclass's ``launch``.
* :func:`http_ok` / :func:`metrics_sum` — readiness and in-flight checks over HTTP.
* :func:`engine_environment` — the environment an engine runs with: the launcher's own
  without Infera's secrets (the admin token, API keys, NATS credentials…).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from infera_core.engines.base import EngineOption, FlagAlias, LaunchContext, LaunchSpec, RunningEngine
from infera_core.errors import EngineError
from infera_core.util.net import free_port
from infera_core.util.prom_text import parse_metrics

if TYPE_CHECKING:  # imported where used: plugins load this module at every CLI start
    import httpx

ENGINE_PYTHON_ENV = "INFERA_ENGINE_PYTHON"

_PROBE = """
import importlib.util, importlib.metadata as md, json, sys
mod, dists = sys.argv[1], sys.argv[2:]
try:
    found = importlib.util.find_spec(mod) is not None
except Exception:
    found = False
versions = {}
for d in dists:
    try:
        versions[d] = md.version(d)
    except Exception:
        versions[d] = None
print(json.dumps({"found": found, "versions": versions}))
"""


@dataclass(frozen=True, slots=True)
class EngineProbe:
    """What a quick look at the engine's interpreter found."""

    python: str
    found: bool
    versions: dict[str, str | None] = field(default_factory=dict)

    @property
    def version(self) -> str | None:
        for value in self.versions.values():
            if value:
                return value
        return None


@dataclass(frozen=True, slots=True)
class EngineLocation:
    """The interpreter that runs the engine and its console script, if any."""

    python: str
    script: str | None
    probe: EngineProbe


def _sibling(path: str, name: str) -> str | None:
    candidate = Path(path).parent / name
    return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None


SECRET_WORDS = frozenset(
    {"TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDS", "CREDENTIALS", "NKEY", "SEED", "JWT"}
)
"""An ``INFERA_*`` variable whose name holds one of these words (between underscores) is a
secret of the router or launcher (``INFERA_ADMIN_TOKEN``, ``INFERA_API_KEY``,
``INFERA_API_KEY_FILE``, ``INFERA_NATS_CREDS``…): never passed on to an engine."""


def is_infera_secret(name: str) -> bool:
    """Whether the environment variable ``name`` is an Infera secret (see :data:`SECRET_WORDS`)."""
    upper = name.upper()
    return upper.startswith("INFERA_") and not SECRET_WORDS.isdisjoint(upper.split("_")[1:])


def engine_environment(inherited: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    """The engine's environment: the launcher's own without its Infera secrets, then what the
    adapter and the hooks set (``extra``, kept as given: they asked for it by name)."""
    env = {k: v for k, v in inherited.items() if not is_infera_secret(k)}
    env.update(extra)
    return env


def probe_python(python: str, module: str, dists: Sequence[str], timeout: float = 20.0) -> EngineProbe:
    """Ask ``python`` (in a subprocess) whether ``module`` is importable and which ``dists`` exist.

    Uses ``importlib.util.find_spec`` and ``importlib.metadata``: nothing of the engine runs.
    """
    try:
        out = subprocess.run(
            [python, "-c", _PROBE, module.split(".")[0], *dists],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=engine_environment(os.environ, {}),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EngineError(f"cannot run the engine interpreter {python}: {exc}") from None
    if out.returncode != 0:
        tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["no output"]
        raise EngineError(f"the engine interpreter {python} failed to start: {tail[0]}")
    try:
        data = json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise EngineError(f"the engine interpreter {python} gave an unreadable answer") from None
    return EngineProbe(python=python, found=bool(data["found"]), versions=dict(data["versions"]))


def locate_engine(
    ctx: LaunchContext,
    *,
    script_name: str | None,
    module: str,
    dists: Sequence[str],
    package_hint: str,
    engine_label: str,
) -> EngineLocation:
    """Resolve ``--engine-python`` (or ``$INFERA_ENGINE_PYTHON``, or the console script on PATH,
    or the current interpreter) and check that the engine is installed there.

    Raises :class:`EngineError` with one line naming the package to install.
    """
    python = ctx.engine_python or os.environ.get(ENGINE_PYTHON_ENV) or None
    script: str | None = None
    if python:
        if not (os.path.isfile(python) and os.access(python, os.X_OK)):
            raise EngineError(f"--engine-python {python}: no such executable")
        script = _sibling(python, script_name) if script_name else None
    else:
        on_path = shutil.which(script_name) if script_name else None
        if on_path:
            script = on_path
            python = _sibling(on_path, "python") or _sibling(on_path, "python3")
        python = python or sys.executable
    probe = probe_python(python, module, dists)
    if not probe.found:
        raise EngineError(
            f"{engine_label} is not installed for {python}: {package_hint} "
            f"(or point --engine-python at the interpreter of the {engine_label} venv)"
        )
    return EngineLocation(python=python, script=script, probe=probe)


def _bindable(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(ctx: LaunchContext, count: int = 1, *, consecutive: bool = False) -> list[int]:
    """``count`` free TCP ports (from ``ctx.free_port`` when it gives real ports).

    With ``consecutive`` the ports are ``p, p+1, …`` (engines that offset by DP rank).
    """

    def one() -> int:
        return ctx.free_port() or free_port("127.0.0.1")

    if not consecutive or count == 1:
        ports: list[int] = []
        for _ in range(count * 20):
            port = one()
            if port not in ports:
                ports.append(port)
            if len(ports) == count:
                return ports
        raise EngineError(f"could not find {count} distinct free ports")
    for _ in range(200):
        base = one()
        if base + count > 65535:
            continue
        if all(_bindable(base + i) for i in range(1, count)):
            return [base + i for i in range(count)]
    raise EngineError(f"could not find {count} consecutive free ports")


def reject_managed_flags(engine_args: Iterable[str], managed: Mapping[str, str]) -> None:
    """Refuse flags after ``--`` that the adapter sets from Infera's own flags.

    ``managed`` maps the engine flag to the Infera flag to use instead.
    """
    for arg in engine_args:
        name = arg.split("=", 1)[0]
        if name in managed:
            raise EngineError(
                f"engine flag {name} is set by Infera; use {managed[name]} instead of passing it after --"
            )


class AdapterBase:
    """What most engine adapters share, as class attributes a subclass sets.

    ``engine_options`` and ``aliases`` answer :meth:`options` and :meth:`flag_aliases`;
    ``managed_flags`` maps an engine flag Infera sets itself to the Infera flag to use
    instead: :meth:`build_launch` refuses them after ``--`` and then calls :meth:`launch`,
    the subclass's argv/env. :meth:`is_ready` asks ``health_path`` for a 200. The adapter
    still implements ``record_fields`` and ``in_flight`` itself (see ``EngineAdapter``).
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    package_hint: ClassVar[str] = ""
    engine_options: ClassVar[Sequence[EngineOption]] = ()
    aliases: ClassVar[Mapping[str, FlagAlias]] = {}
    managed_flags: ClassVar[Mapping[str, str]] = {}
    """Engine flags after ``--`` that Infera sets itself → the Infera flag to use instead."""
    health_path: ClassVar[str] = "/health"

    def options(self) -> Sequence[EngineOption]:
        return self.engine_options

    def flag_aliases(self) -> Mapping[str, FlagAlias]:
        return self.aliases

    def build_launch(self, ctx: LaunchContext) -> LaunchSpec:
        reject_managed_flags(ctx.engine_args, self.managed_flags)
        return self.launch(ctx)

    def launch(self, ctx: LaunchContext) -> LaunchSpec:
        """The argv/env for this engine (subclasses)."""
        raise NotImplementedError

    async def is_ready(self, engine: RunningEngine) -> bool:
        return await http_ok(engine.client, engine.url + self.health_path)


async def http_ok(client: httpx.AsyncClient, url: str) -> bool:
    """True when ``GET url`` answers 200."""
    import httpx

    try:
        response = await client.get(url)
    except httpx.HTTPError:
        return False
    return response.status_code == 200


def metrics_sum(text: str, names: Sequence[str]) -> float | None:
    """Sum every sample of the Prometheus metrics ``names`` (any labels) in ``text``.

    None when none of the names appears.
    """
    sums = parse_metrics(text, names)
    return sum(sums.values()) if sums else None


async def metrics_in_flight(client: httpx.AsyncClient, base_url: str, names: Sequence[str]) -> int | None:
    """Running + waiting requests from the engine's ``/metrics`` (None when unknown)."""
    import httpx

    try:
        response = await client.get(f"{base_url}/metrics")
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    total = metrics_sum(response.text, names)
    return None if total is None else round(total)


def bracket_host(host: str) -> str:
    """``host`` ready for a URL or ``host:port`` (IPv6 literals in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def dp_layout(ctx: LaunchContext) -> tuple[int | None, int]:
    """``(dp_rank, dp_size)`` from the launcher's context, else the adapter's own
    ``dp_rank`` / ``dp_size`` options (for launchers without DP flags)."""
    size = ctx.dp_size if ctx.dp_size > 1 else int(ctx.options.get("dp_size") or 1)
    rank = ctx.dp_rank if ctx.dp_rank is not None else ctx.options.get("dp_rank")
    if size < 1:
        raise EngineError(f"--dp-size {size}: must be at least 1")
    if rank is not None and not 0 <= int(rank) < size:
        raise EngineError(f"--dp-rank {rank}: must be between 0 and --dp-size - 1 ({size - 1})")
    return (None if rank is None else int(rank)), size
