"""``python -m infera_core bench …`` as the bench tests run it, its JSON and report in a folder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def bench_cli(out_dir: Path, *args: str, timeout: float) -> tuple[str, dict[str, Any]]:
    """Run ``bench`` with ``args`` plus ``--json out_dir/r.json --report out_dir/rep --quiet``;
    it must exit 0. Returns its stdout and the JSON it wrote."""
    argv = [sys.executable, "-m", "infera_core", "bench", *args]
    argv += ["--json", str(out_dir / "r.json"), "--report", str(out_dir / "rep"), "--quiet"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout, json.loads((out_dir / "r.json").read_text())
