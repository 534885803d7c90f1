"""``infera_core.util``: leaf helpers (``free_port``) that import nothing from ``infera_core``."""

from __future__ import annotations

import ast
import socket
from pathlib import Path

import pytest

from infera_core.util.net import free_port

UTIL = Path(__file__).resolve().parents[2] / "infera_core" / "util"


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_free_port_gives_a_port_the_caller_can_bind(host: str) -> None:
    port = free_port(host)
    assert 0 < port < 65536
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, port))
        s.listen(1)


def test_util_modules_import_nothing_from_infera_core() -> None:
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
                if n.split(".")[0] == "infera_core" and not n.startswith("infera_core.util")
            ]
    assert UTIL.joinpath("net.py").exists() and not found
