"""Plugin authors type-check against infera_core: its packages ship ``py.typed``."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples/infera-example-policy/infera_example_policy/plugin.py"


def _packages() -> list[Path]:
    """Every regular import package of every distribution in the repository (the engine
    plugins' shared ``infera`` namespace package cannot carry a marker: PEP 561 puts it in
    a namespace's regular subpackages, and ``infera.engine`` has only modules)."""
    out = []
    for pyproject in [ROOT / "pyproject.toml", *sorted(ROOT.glob("*/*/pyproject.toml"))]:
        tool = tomllib.loads(pyproject.read_text()).get("tool", {})
        names = tool.get("hatch", {}).get("build", {}).get("targets", {}).get("wheel", {}).get("packages")
        names = names or tool.get("setuptools", {}).get("packages", [])
        out += [pyproject.parent / n for n in names if (pyproject.parent / n / "__init__.py").exists()]
    return out


@pytest.mark.parametrize("package", _packages(), ids=lambda p: p.name)
def test_every_package_has_a_py_typed_marker(package: Path) -> None:
    assert (package / "py.typed").is_file()


def test_an_out_of_tree_plugin_passes_mypy_strict(tmp_path: Path) -> None:
    mypy = Path(sys.executable).with_name("mypy")
    if not mypy.exists():
        pytest.skip("mypy is not installed in this environment")
    plugin = tmp_path / "my_plugin.py"
    shutil.copy(EXAMPLE, plugin)  # a plugin module outside the repository (no repo mypy config)
    proc = subprocess.run(
        [str(mypy), "--strict", "--cache-dir", str(tmp_path / "cache"), plugin.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
