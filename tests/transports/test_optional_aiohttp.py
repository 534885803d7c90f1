"""aiohttp is optional (``infera-core[aiohttp]``): core imports and serves without it, and
what needs it says so in one line at start (run here with aiohttp made unimportable)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

WITHOUT_AIOHTTP = "import sys; sys.modules['aiohttp'] = None; "
"""Prefix of a ``python -c`` program: ``import aiohttp`` then fails as if not installed."""

NEEDS_AIOHTTP = {
    "infera_core.bench.client",  # the load generator (infera-run bench, up --demo)
    "infera_core.up.compare",
    "infera_core.bench.plan",
    "infera_core.bench.runner",
    "infera_core.transports.http.aiohttp_upstream",  # serve --http-client aiohttp
    "infera_core.server.upstream_aiohttp",  # its old path (a re-export)
    "infera_core.up.demo",
}

IMPORT_ALL = """
import importlib, pkgutil
import infera_core
failed = []
for mod in pkgutil.walk_packages(infera_core.__path__, prefix="infera_core."):
    if not mod.name.endswith("__main__"):
        try:
            importlib.import_module(mod.name)
        except ImportError:
            failed.append(mod.name)
print(" ".join(sorted(failed)))
"""


def _run(program: str, *args: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("INFERA_")}
    clean.update(HOME=str(tmp_path), INFERA_LOAD_PLUGINS="none", **env)  # core's built-ins only
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_AIOHTTP + program, *args],
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow  # imports every core module in a fresh interpreter
def test_core_modules_import_without_aiohttp(tmp_path: Path) -> None:
    proc = _run(IMPORT_ALL, tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert set(proc.stdout.split()) == NEEDS_AIOHTTP


MAIN = "from infera_core.cli import main; main()"


@pytest.mark.parametrize(
    ("argv", "env", "line"),
    [
        (
            ["serve", "--http-client", "aiohttp"],
            {},
            "--http-client aiohttp: aiohttp is not installed (pip install 'infera-core[aiohttp]')",
        ),
        (
            ["serve", "--upstream-transport", "aiohttp"],
            {},
            "--http-client aiohttp: aiohttp is not installed (pip install 'infera-core[aiohttp]')",
        ),
        (
            ["serve"],
            {"INFERA_HTTP_CLIENT": "aiohttp"},
            "--http-client aiohttp: aiohttp is not installed (pip install 'infera-core[aiohttp]')",
        ),
        (
            ["bench", "--url", "http://127.0.0.1:9/v1"],
            {},
            "infera-run bench: aiohttp is not installed (pip install 'infera-core[bench]')",
        ),
        (["up", "--demo"], {}, "--demo: aiohttp is not installed (pip install 'infera-core[aiohttp]')"),
    ],
    ids=[
        "serve --http-client",
        "serve --upstream-transport",
        "serve INFERA_HTTP_CLIENT",
        "bench",
        "up --demo",
    ],
)
def test_what_needs_aiohttp_stops_at_start_with_one_line(
    argv: list[str], env: dict[str, str], line: str, tmp_path: Path
) -> None:
    proc = _run(MAIN, *argv, tmp_path=tmp_path, **env)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [f"infera-run: error: {line}"]


def test_serve_with_the_native_client_needs_no_aiohttp(tmp_path: Path) -> None:
    """The default client: serve gets past the check (and stops later, on the missing file)."""
    proc = _run(MAIN, "serve", "--discovery", "static", "--static-file", "missing.yaml", tmp_path=tmp_path)
    assert proc.returncode == 1 and "aiohttp" not in proc.stderr
    assert "missing.yaml" in proc.stderr and "Traceback" not in proc.stderr
