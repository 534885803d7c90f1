"""``infera_core.util``: leaf helpers (``free_port``) that import nothing from ``infera_core``."""

from __future__ import annotations

import ast
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from infera_core.util.net import free_port, stop_groups, stop_process

UTIL = Path(__file__).resolve().parents[2] / "infera_core" / "util"


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_free_port_gives_a_port_the_caller_can_bind(host: str) -> None:
    port = free_port(host)
    assert 0 < port < 65536
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, port))
        s.listen(1)


def test_util_modules_import_nothing_from_infera_core_outside_util() -> None:
    found = []
    for path in sorted(UTIL.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            found += [
                f"{path.name}: {n}"
                for n in names
                if n.split(".")[0] == "infera_core" and not n.startswith("infera_core.util.")
            ]
    assert UTIL.joinpath("net.py").exists() and not found


# A child that says it is ready, then ignores SIGTERM (only SIGKILL ends it), or exits on SIGINT.
_STUBBORN = "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(600)"
_POLITE = "import sys, time; print('ready', flush=True); time.sleep(600)"


def _started(code: str, new_session: bool = False) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=new_session
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def test_stop_process_sends_the_given_signal_and_kills_after_the_grace() -> None:
    polite = _started(_POLITE)
    stop_process(polite, grace=30, sig=signal.SIGINT)
    assert polite.returncode == -signal.SIGINT  # SIGINT reached it: no kill was needed
    stubborn = _started(_STUBBORN)
    stop_process(stubborn, grace=0.2)
    assert stubborn.returncode == -signal.SIGKILL
    stop_process(stubborn)  # an exited process is left alone


def test_stop_groups_signals_each_group_and_kills_the_ones_that_stay() -> None:
    polite, stubborn = _started(_POLITE, True), _started(_STUBBORN, True)
    stop_groups([polite, stubborn], grace=0.5)
    assert (polite.returncode, stubborn.returncode) == (-signal.SIGTERM, -signal.SIGKILL)
    stop_groups([polite, stubborn])  # groups that are gone are passed over
