"""bench/fleet/saturation.py runs end to end on the shipped trace and ranks the policies sensibly."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import bench

ROOT = Path(bench.__file__).resolve().parents[1]


def _table(out: str) -> dict[str, list[float]]:
    rows = {}
    for line in out.splitlines():
        m = re.match(r"^(kv-aware|kv-aware-no-linger|round-robin|sglang-cache-aware)\s+([0-9.]+\s.*)$", line)
        if m:
            rows[m.group(1)] = [float(x) for x in m.group(2).split()]
    return rows


def test_kv_aware_caches_more_and_answers_sooner_than_round_robin_near_capacity() -> None:
    proc = _run("--rows", "400", "--speedup", "45", "--policies", "kv-aware,round-robin,sglang-cache-aware")
    assert "pooled-LRU bound hit" in proc.stdout, proc.stdout
    rows = _table(proc.stdout)
    kv, rr, sg = rows["kv-aware"], rows["round-robin"], rows["sglang-cache-aware"]
    # columns: TTFT p50, p90, p99, hit, hit/bound, max/mean, preemptions, µs/decision
    assert kv[3] > 2 * rr[3], proc.stdout
    assert kv[1] <= rr[1], proc.stdout
    assert 0.0 < kv[4] <= 1.0 + 1e-9, proc.stdout
    # and at least as well as sglang-router's cache_aware (virtual time: the run is deterministic)
    assert kv[3] >= sg[3] and kv[1] <= sg[1], proc.stdout
    assert re.search(r"^kv-aware TTFT p90 / round-robin's: [0-9.]+$", proc.stdout, re.M), proc.stdout
    assert re.search(r"^kv-aware / sglang-cache-aware: TTFT p90 [0-9.]+, hit [0-9.]+$", proc.stdout, re.M)


def test_kv_aware_keeps_its_hits_when_kv_events_lag() -> None:
    """Events indexed 2 s (virtual) after they were emitted: the credit kept 2 s past a request's
    end bridges the gap; without it the next request of the group sees its prefix nowhere."""
    policies = "kv-aware,kv-aware-no-linger"
    proc = _run("--rows", "400", "--speedup", "8", "--event-lag", "2", "--policies", policies)
    rows = _table(proc.stdout)
    linger, none = rows["kv-aware"], rows["kv-aware-no-linger"]
    assert linger[4] > 0.95 and linger[3] > 1.2 * none[3], proc.stdout


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    # no --trace: the default is the Mooncake trace shipped in bench/data/
    return subprocess.run(
        [sys.executable, "-m", "bench.fleet.saturation", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    )
