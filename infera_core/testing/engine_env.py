"""Fake engine venvs for engine adapter tests: an interpreter wrapper whose ``sys.path`` holds
a stand-in engine package (and, optionally, its distribution metadata and console script).

The adapters probe the engine interpreter in a subprocess, so these fakes exercise the
real probe and the real argv without the engine (vLLM, SGLang, ATOM…) installed. Also the
golden-argv helpers: :data:`GOLDEN_WORKER`, :func:`launch_context`, :func:`flag`, :func:`clean_environ`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from infera_core.engines.base import LaunchContext
from infera_core.launcher.address import free_port
from infera_core.worker import Role


@dataclass
class FakeEngineEnv:
    root: Path
    python: str
    site: Path

    @property
    def bin(self) -> Path:
        return Path(self.python).parent


def _touch_package(site: Path, dotted: str, source: str) -> None:
    parts = dotted.split(".")
    folder = site
    for part in parts[:-1]:
        folder = folder / part
        folder.mkdir(exist_ok=True)
        (folder / "__init__.py").touch()
    (folder / f"{parts[-1]}.py").write_text(source)


def make_engine_env(
    root: Path,
    module: str | None,
    *,
    dist: str | None = None,
    version: str = "0.0.1",
    script: str | None = None,
    source: str = "",
) -> FakeEngineEnv:
    """A ``bin/python`` that runs this interpreter with ``site`` on ``PYTHONPATH``.

    ``module`` (dotted) gets ``source`` as its code; ``dist`` adds installed-package
    metadata; ``script`` adds an executable of that name next to ``python``.
    """
    site = root / "site"
    bindir = root / "bin"
    site.mkdir(parents=True)
    bindir.mkdir()
    if module:
        _touch_package(site, module, source)
    if dist:
        info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    python = bindir / "python"
    python.write_text(
        f'#!/bin/sh\nPYTHONPATH="{site}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{sys.executable}" "$@"\n'
    )
    python.chmod(0o755)
    if script:
        exe = bindir / script
        exe.write_text("#!/bin/sh\necho stand-in console script\n")
        exe.chmod(0o755)
    return FakeEngineEnv(root=root, python=str(python), site=site)


def clean_environ(**extra: str) -> dict[str, str]:
    """This environment without ``INFERA_*`` settings (every installed plugin loads), plus ``extra``."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERA_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


GOLDEN_WORKER: dict[str, object] = {
    "worker_id": "w1",
    "model": "tiny",
    "model_path": "/models/tiny",
    "host": "127.0.0.1",
    "port": 8100,
    "advertise_host": "10.0.0.5",
}
"""The worker of the golden-argv tests: ``w1`` serving ``/models/tiny`` as ``tiny`` on
127.0.0.1:8100, reached by peers at 10.0.0.5 (``launch_context``'s ``defaults``)."""


def launch_context(defaults: dict[str, object], first_port: int | None = None, **kw: object) -> LaunchContext:
    """An adapter test's :class:`LaunchContext`: ``defaults`` (a mixed worker unless they say
    otherwise) with ``kw`` on top. Free ports count up from ``first_port``, so golden argv
    are the same every run; without it they are real free ports (for a test that binds them)."""
    if first_port is None:
        free: Callable[[], int] = free_port
    else:
        ports = iter(range(first_port, first_port + 100))
        free = ports.__next__
    base: dict[str, object] = {"role": Role.MIXED, "free_port": free, **defaults}
    base.update(kw)
    return LaunchContext(**base)  # type: ignore[arg-type]


def flag(argv: list[str], name: str) -> str:
    """The value after ``name`` in ``argv``."""
    return argv[argv.index(name) + 1]
