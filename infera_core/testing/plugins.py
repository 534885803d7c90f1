"""Install throw-away plugin distributions in a temp dir and run the real ``infera-run``.

``importlib.metadata`` finds any ``*.dist-info`` directory on ``sys.path``, so a
folder holding a module plus ``<name>-<version>.dist-info/{METADATA,entry_points.txt}``
and put on ``PYTHONPATH`` behaves like an installed distribution — enough to test
plugin discovery, failures and versions without pip.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path


def write_distribution(
    root: Path,
    name: str,
    version: str,
    entry_points: Mapping[str, str],
    modules: Mapping[str, str] | None = None,
) -> Path:
    """Write a fake installed distribution under ``root``; returns ``root``.

    ``entry_points`` are ``infera`` entry points (plugin name → module); ``modules``
    maps a dotted module name to its source (dedented). Packages get ``__init__.py``.
    """
    root.mkdir(parents=True, exist_ok=True)
    for dotted, source in (modules or {}).items():
        parts = dotted.split(".")
        pkg = root.joinpath(*parts[:-1])
        pkg.mkdir(parents=True, exist_ok=True)
        for i in range(1, len(parts)):
            init = root.joinpath(*parts[:i], "__init__.py")
            if not init.exists():
                init.write_text("")
        (pkg / f"{parts[-1]}.py").write_text(textwrap.dedent(source))
    dist_info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    dist_info.mkdir(exist_ok=True)
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    eps = "".join(f"{k} = {v}\n" for k, v in entry_points.items())
    (dist_info / "entry_points.txt").write_text(f"[infera]\n{eps}")
    return root


def infera_run_path() -> str:
    """The ``infera-run`` console script of the running interpreter's environment."""
    script = Path(sys.executable).with_name("infera-run")
    return str(script) if script.exists() else "infera-run"


def run_infera(
    args: Sequence[str],
    pythonpath: Sequence[Path] = (),
    env: Mapping[str, str] | None = None,
    timeout: float = 60.0,
) -> subprocess.CompletedProcess[str]:
    """Run the real ``infera-run`` with extra ``PYTHONPATH`` entries and env vars.

    ``INFERA_*`` variables of the calling process are dropped so results do not
    depend on the developer's shell.
    """
    base = {k: v for k, v in os.environ.items() if not k.startswith("INFERA_")}
    if pythonpath:
        extra = os.pathsep.join(str(p) for p in pythonpath)
        base["PYTHONPATH"] = extra + (os.pathsep + base["PYTHONPATH"] if base.get("PYTHONPATH") else "")
    base.update(env or {})
    return subprocess.run(
        [infera_run_path(), *args],
        capture_output=True,
        text=True,
        env=base,
        timeout=timeout,
        check=False,
    )
