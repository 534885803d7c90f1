"""bench/fleet/saturation_live.py runs end to end: real sim processes, real routers, real HTTP load."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import bench

ROOT = Path(bench.__file__).resolve().parents[1]


@pytest.mark.slow
def test_live_replay_reports_every_router_and_kv_aware_finds_more_cached_tokens() -> None:
    # light load (0.2x the fleet's prefill rate) over rows that reuse prefixes: a shared prefix
    # is cached and its KV events are in before the next request for it, however loaded the
    # machine (at load 0.99, 100 rows of little reuse, the gap fell within noise under CI
    # contention: hit 0.036 vs 0.029)
    args = ["--rows", "200", "--sims", "2", "--speedup", "3", "--sim-speedup", "1"]  # the shipped trace
    # the dev venv has no sglang-router: that router is reported as skipped, the others run
    args += ["--routers", "kv-aware,round-robin,sglang-cache-aware", "--sglang-python", sys.executable]
    argv = [sys.executable, "-m", "bench.fleet.saturation_live", *args]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "pooled-LRU bound hit" in proc.stdout, proc.stdout
    assert "sglang-cache-aware: sglang-router not importable" in proc.stdout, proc.stdout
    rows = {}
    for line in proc.stdout.splitlines():
        m = re.match(r"^(kv-aware|round-robin)\s+([0-9. ]+?)\s+\(loop", line)
        if m:
            rows[m.group(1)] = [float(x) for x in m.group(2).split()]
    # columns: TTFT p50, p90, p99, hit, hit/bound, preemptions, errors, late p99 ms, router CPU ms/req
    kv, rr = rows["kv-aware"], rows["round-robin"]
    assert kv[6] == 0 and rr[6] == 0, proc.stdout  # every request answered
    assert 0 < kv[0] <= kv[1] <= kv[2], proc.stdout
    # the sims' own counters: kv-aware sends shared prefixes to the sim that holds them
    assert kv[3] > 1.25 * rr[3] > 0, proc.stdout
    # near the pooled-LRU bound: 1.00 measured alone, round-robin 0.24-0.54. The bound is a
    # hit of ~0.05 over these rows, so a few prompts routed away (their prefix's KV events
    # indexed after the next request for it came, on a machine at load 4+) move the ratio a
    # lot: 0.79 in one CI run beside two busy loops
    assert kv[4] >= 0.6, proc.stdout
