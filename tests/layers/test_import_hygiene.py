"""No plugin module may import an engine (torch, vllm, sglang, atom) at import time."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from infera_core.testing.contracts import ENGINE_MODULES

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import importlib, json, pkgutil, sys
    from importlib.metadata import entry_points

    roots = json.loads(sys.argv[1])
    imported = []
    for ep in entry_points(group="infera"):
        importlib.import_module(ep.module)
        imported.append(ep.module)
    for path, pkg in roots:
        importlib.import_module(pkg)
        imported.append(pkg)

        def fail(name):
            raise ImportError(f"cannot import {name}")

        for mod in pkgutil.walk_packages([path], prefix=pkg + ".", onerror=fail):
            if mod.name.endswith(".__main__"):  # a script (`python -m pkg`), runs on import
                continue
            importlib.import_module(mod.name)
            imported.append(mod.name)
    engines = sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules)
    print(json.dumps({"imported": imported, "engines": engines}))
    """
)


@pytest.mark.slow  # imports every module of every plugin in a fresh interpreter
def test_importing_every_plugin_module_imports_no_engine() -> None:
    packages = sorted(
        p
        for pattern in ("plugins/*/infera_*", "examples/*/infera_*")
        for p in ROOT.glob(pattern)
        if p.is_dir() and "." not in p.name  # not setuptools' *.egg-info
    )
    assert packages, "no plugin packages found"
    roots = [[str(p), p.name] for p in packages]
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(roots), json.dumps(ENGINE_MODULES)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["engines"] == [], f"engine packages imported: {result['engines']}"
    imported = set(result["imported"])
    for name in ("infera_vllm.plugin", "infera_sglang.plugin", "infera_atom.plugin", "infera_core.builtin"):
        assert name in imported
