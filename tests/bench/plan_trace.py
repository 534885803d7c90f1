"""A small Mooncake trace and a slow timing profile whose fleet size is plain to see: one
worker falls behind (its queue grows all along the trace), two keep up with room to spare."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
ROWS = 40
GAP_MS = 200
INPUT = 500
OUTPUT = 4
PROFILE = {
    "schema": "infera.timing/v1",
    "engine": "test",
    "prefill_tokens_per_s": 2000.0,  # 500 tokens: 0.25 s, more than the 0.2 s between arrivals
    "prefill_base_ms": 0.0,
    "itl_base_ms": 20.0,
    "itl_slope_ms": 0.0,
}
SLO = "ttft_p90=600ms,tpot_p90=500ms"


def write_trace(path: Path, rows: int = ROWS) -> Path:
    """``rows`` requests of unique 500-token prompts, one every 0.2 s."""
    with path.open("w") as f:
        for k in range(rows):
            row = {"timestamp": k * GAP_MS, "input_length": INPUT, "output_length": OUTPUT, "hash_ids": [k]}
            f.write(json.dumps(row) + "\n")
    return path


def write_profile(path: Path, **over: Any) -> Path:
    path.write_text(json.dumps({**PROFILE, **over}))
    return path


def plan_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "infera_core", "plan", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        check=False,
    )
