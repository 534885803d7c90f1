"""The exec wrapper every engine starts behind (no Python between fork and exec in the launcher)."""

from __future__ import annotations

import os
import subprocess
import sys

from infera_core.launcher.pdeathsig import PARENT_ENV

WRAP = [sys.executable, "-m", "infera_core.launcher.pdeathsig"]


def _run(*argv: str, parent: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != PARENT_ENV}
    if parent is not None:
        env[PARENT_ENV] = parent
    return subprocess.run([*WRAP, *argv], env=env, capture_output=True, text=True, timeout=30, check=False)


def test_execs_the_engine_in_place_and_hides_its_own_variable() -> None:
    """Same pid as the process the launcher spawned: it watches and signals the engine itself."""
    env = {**os.environ, PARENT_ENV: str(os.getpid())}
    code = f"import os; print(os.getpid(), os.environ.get({PARENT_ENV!r}))"
    proc = subprocess.Popen([*WRAP, sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=30)
    pid, var = out.split()
    assert proc.returncode == 0 and int(pid) == proc.pid and var == "None"


def test_starts_nothing_when_the_launcher_is_already_gone() -> None:
    out = _run(sys.executable, "-c", "print('engine ran')", parent="1")  # our parent is not pid 1
    assert out.returncode == 0 and "engine ran" not in out.stdout


def test_a_missing_program_is_one_clear_line() -> None:
    out = _run("/no/such/engine")
    assert (
        out.returncode == 1 and out.stderr.strip() == "cannot run /no/such/engine: No such file or directory"
    )
