"""The plugin tutorials (docs/tutorials/), followed to the letter: their files are written, their commands run.

A fresh ``uv`` venv gets infera-core from this checkout (offline from uv's cache when it
can, else from the package index); then every ``file=`` block of the guide is written
and every ``bash run=`` block is run in order, with the guide's placeholder venv path
replaced by that venv. The policy plugin and the engine plugin must build (``uv build``),
type-check with ``mypy --strict``, pass their own tests, install, and show up in
``infera-run plugins`` / ``engines`` / ``worker echo --help``. A broken snippet or command
in the guide fails this test at its line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from guide_blocks import VENV_PLACEHOLDER, Block, guide_blocks, guide_files

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_ENGINE = ROOT / "examples" / "infera-example-engine"

# what each plugin's commands must have printed (beyond exiting 0)
EXPECTED = {
    "infera-example-policy": [
        "Success: no issues found",  # mypy --strict
        " passed",  # its tests
        "example_policy",  # infera-run plugins
        "prefer-label",  # infera-run policies
        "infera_example_policy-0.1.0-py3-none-any.whl",  # uv build
    ],
    "infera-example-engine": [
        "Success: no issues found",
        " passed",
        "example_engine",  # infera-run engines: the plugin column
        "Usage: infera-run worker echo",  # worker echo --help (and python -m infera.engine.echo --help)
        "--kv-events-port",
        "infera_example_engine-0.1.0-py3-none-any.whl",
    ],
}


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment a reader has: none of this test run's venv, import path or INFERA_* settings."""
    drop = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "CONDA_PREFIX")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("INFERA_")}
    return {**env, **extra}


def _uv(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["uv", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
    )


def _make_venv(base: Path) -> tuple[Path, dict[str, str]]:
    """A venv with infera-core (this checkout, editable) and the reader's tools; the env to use."""
    venv = base / "venv"
    env = _clean_env()
    made = _uv(["venv", "-q", "-p", sys.executable, str(venv)], env, base)
    assert made.returncode == 0, made.stderr
    install = ["pip", "install", "-q", "-p", str(venv / "bin" / "python"), "-e", str(ROOT)]
    offline = {**env, "UV_OFFLINE": "1"}
    done = _uv(install, offline, base)
    if done.returncode == 0:
        return venv, offline
    online = _uv(install, env, base)  # a cold uv cache: from the package index
    if online.returncode != 0 and any(w in online.stderr for w in ("network", "connect", "dns", "offline")):
        pytest.skip(
            f"infera-core's dependencies are neither in uv's cache nor reachable: {online.stderr[-300:]}"
        )
    assert online.returncode == 0, f"installing infera-core failed:\n{done.stderr}\n{online.stderr}"
    return venv, env


def _run(block: Block, workspace: Path, venv: Path, env: dict[str, str]) -> str:
    cwd = workspace / block.target
    cwd.mkdir(parents=True, exist_ok=True)
    script = "set -euo pipefail\n" + block.body.replace(VENV_PLACEHOLDER, str(venv))
    out = subprocess.run(
        ["bash", "-c", script],
        cwd=cwd,
        env={**env, "VENV": str(venv), "MYPY_CACHE_DIR": str(workspace / ".mypy_cache")},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = out.stdout + out.stderr
    assert out.returncode == 0, (
        f"{block.page} line {block.line}: the commands failed (exit {out.returncode}) in "
        f"{block.target}:\n{block.body}\n--- output ---\n{output[-4000:]}"
    )
    return output


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.skipif(shutil.which("uv") is None, reason="uv is not installed")
def test_a_reader_builds_typechecks_tests_and_installs_both_plugins(tmp_path: Path) -> None:
    venv, env = _make_venv(tmp_path)
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    outputs: dict[str, str] = {}
    for block in guide_blocks():
        if block.kind == "file":
            path = workspace / block.target
            path.parent.mkdir(parents=True, exist_ok=True)
            before = path.read_text() + "\n\n" if path.exists() else ""
            path.write_text(before + block.body)
        else:
            outputs[block.target] = outputs.get(block.target, "") + _run(block, workspace, venv, env)
    assert sorted(outputs) == sorted(EXPECTED), f"the guide runs commands in {sorted(outputs)}"
    for plugin, markers in EXPECTED.items():
        missing = [m for m in markers if m not in outputs[plugin]]
        assert not missing, (
            f"{plugin}: the guide's commands never printed {missing}:\n{outputs[plugin][-3000:]}"
        )


def test_the_guide_has_both_plugins_and_runs_what_it_shows() -> None:
    blocks = guide_blocks()
    files = guide_files(blocks)
    for plugin in EXPECTED:
        assert f"{plugin}/pyproject.toml" in files, f"the guide never writes {plugin}/pyproject.toml"
        runs = "\n".join(b.body for b in blocks if b.kind == "run" and b.target == plugin)
        for step in ("uv pip install -p $VENV/bin/python -e .", "mypy --strict", "pytest", "uv build"):
            assert step in runs, f"the guide's {plugin} commands lack {step!r}"
        assert VENV_PLACEHOLDER in runs


def test_the_example_engine_plugin_is_the_guides() -> None:
    """examples/infera-example-engine is exactly what the engine plugin tutorial writes."""
    prefix = "infera-example-engine/"
    files = {k[len(prefix) :]: v for k, v in guide_files(guide_blocks()).items() if k.startswith(prefix)}
    assert files, "the guide writes no infera-example-engine files"
    for rel, text in files.items():
        shipped = EXAMPLE_ENGINE / rel
        assert shipped.is_file(), f"examples/infera-example-engine/{rel} is missing"
        assert shipped.read_text().rstrip("\n") == text.rstrip("\n"), (
            f"examples/infera-example-engine/{rel} differs from docs/tutorials/engine-plugin.md"
        )
