"""``bench/kv/decision.py --interleave``: the presets routed in turn over one fleet, a line per
fleet size with each preset's mean / median / p99 µs per decision."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import bench

ROOT = Path(bench.__file__).resolve().parents[1]


def test_interleaved_presets_report_mean_median_and_p99_per_decision() -> None:
    argv = [sys.executable, "-m", "bench.kv.decision", "--workers", "8,64", "--tokens", "256"]
    argv += [
        "--requests",
        "100",
        "--prefixes",
        "4",
        "--presets",
        "kv-aware,predicted-latency",
        "--interleave",
    ]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300, check=True).stdout
    lines = out.splitlines()
    assert "kv-aware µs" in lines[0] and "predicted-latency µs" in lines[0]
    rows = [re.findall(r"(\d+) / (\d+) / (\d+)", line) for line in lines[1:]]
    assert [line.split()[:2] for line in lines[1:]] == [["8", "256"], ["64", "256"]]
    assert all(len(cells) == 2 and all(int(x) > 0 for cell in cells for x in cell) for cells in rows)
