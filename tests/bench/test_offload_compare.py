"""``bench --compare`` with offloading sims: router-config policy variants and per-tier hit rates."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from infera_core.bench.compare import policy_variant
from infera_core.errors import ConfigError
from infera_core.scheduling.router_config import load_router_config
from infera_core.testing.fixtures import make_hooks

pytest.importorskip("infera_sim")

REPO = Path(__file__).resolve().parents[2]
NO_CREDIT = REPO / "bench" / "policies" / "kv-aware-no-tier-credit.yaml"


def test_a_yaml_entry_is_a_router_config_labelled_by_its_stem(tmp_path: Path) -> None:
    assert policy_variant("kv-aware") == ("kv-aware", "kv-aware", None)
    assert policy_variant(str(NO_CREDIT)) == ("kv-aware-no-tier-credit", None, NO_CREDIT)
    with pytest.raises(ConfigError, match="not found"):
        policy_variant(str(tmp_path / "missing.yaml"))


def test_the_no_credit_variant_is_kv_aware_with_zero_cpu_and_disk_weights() -> None:
    policies = make_hooks().catalog().policies
    label, variant = load_router_config(NO_CREDIT).resolve(policies, str(NO_CREDIT))
    preset = policies.preset("kv-aware").profile
    assert label == "custom"
    assert variant.filters == preset.filters and variant.picker == preset.picker
    assert [(s.name, s.weight) for s in variant.scorers] == [(s.name, s.weight) for s in preset.scorers]
    overlap = variant.scorers[0]
    assert overlap.name == "kv-overlap" and overlap.params == {"gpu": 1.0, "cpu": 0.0, "disk": 0.0}


@pytest.mark.slow
def test_compare_reports_the_offloaded_tier_hit_rate(tmp_path: Path) -> None:
    """Two sims whose GPU cannot hold two prefixes: the CPU tier holds what the GPU evicts."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "infera_core",
            "bench",
            "--compare",
            "--policies",
            f"kv-aware,{NO_CREDIT}",
            "--workers",
            "2",
            "--engine-args",
            "--cache-blocks 16 --cpu-blocks 128 --speedup 20",
            "--workload",
            "shared-prefix",
            "--groups",
            "4",
            "--prefix-len",
            "160",
            "--questions-per-group",
            "4",
            "--question-len",
            "8",
            "--output-len",
            "4",
            "--concurrency",
            "2",
            "--json",
            str(tmp_path / "r.json"),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "offloaded-tier hit rate" in out.stdout
    runs = json.loads((tmp_path / "r.json").read_text())["runs"]
    assert [r["label"] for r in runs] == ["kv-aware", "kv-aware-no-tier-credit"]
    for run in runs:
        s = run["summary"]
        assert s["completed"] == s["requests"] == 16
        assert s["offload_hit_rate"] is not None and s["prefix_cache_hit_rate"] is not None
        assert run["cache"]["offload_hits"] == pytest.approx(s["offload_hit_rate"] * run["cache"]["queries"])
    # 4 prefixes of 10 blocks, GPUs of 16 blocks: prefixes evicted to the CPU tier come back from it
    assert runs[0]["cache"]["offload_hits"] > 0
