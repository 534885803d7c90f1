"""``bench --compare`` with offloading sims: policy variants and per-tier hit rates."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_cli import bench_cli

from infera_core.bench.variants import parse_variant
from infera_core.errors import ConfigError
from infera_core.scheduling.router_config import load_router_config
from infera_core.testing.fixtures import make_hooks

pytest.importorskip("infera_sim")

NO_CREDIT = "kv-aware:kv-overlap.cpu=0:kv-overlap.disk=0"


def test_a_preset_variant_is_the_installed_preset_with_the_changed_parameters(tmp_path: Path) -> None:
    policies = make_hooks().catalog().policies
    variant = parse_variant(NO_CREDIT, policies, tmp_path)
    assert variant.label == NO_CREDIT and variant.preset is None and variant.router_config is not None
    label, profile = load_router_config(variant.router_config).resolve(policies, "variant")
    preset = policies.preset("kv-aware").profile
    assert label == "custom"
    assert profile.filters == preset.filters and profile.picker == preset.picker
    assert [(s.name, s.weight) for s in profile.scorers] == [(s.name, s.weight) for s in preset.scorers]
    overlap = next(s for s in profile.scorers if s.name == "kv-overlap")
    assert overlap.params == {
        **next(s for s in preset.scorers if s.name == "kv-overlap").params,
        "cpu": 0,
        "disk": 0,
    }
    heavier = parse_variant("kv-aware:load.weight=0.5", policies, tmp_path).router_config
    assert heavier is not None
    _, profile = load_router_config(heavier).resolve(policies, "variant")
    assert next(s for s in profile.scorers if s.name == "load").weight == 0.5


def test_plain_presets_yaml_files_and_bad_entries(tmp_path: Path) -> None:
    policies = make_hooks().catalog().policies
    assert parse_variant("round-robin", policies, tmp_path).preset == "round-robin"
    config = tmp_path / "mine.yaml"
    config.write_text("preset: least-load\n")
    variant = parse_variant(str(config), policies, tmp_path)
    assert variant.label == "mine" and variant.router_config == config
    for entry, message in (
        (str(tmp_path / "missing.yaml"), "not found"),
        ("no-such-preset:x.y=1", "no-such-preset"),
        ("kv-aware:kv-overlap=0", "NAME.PARAM=VALUE"),
        ("kv-aware:nothing.cpu=0", "has no 'nothing'"),
        ("kv-aware:kv-overlap.weight=much", "weight is a number"),
    ):
        with pytest.raises(ConfigError, match=message):
            parse_variant(entry, policies, tmp_path)


@pytest.mark.slow
def test_compare_reports_the_offloaded_tier_hit_rate(tmp_path: Path) -> None:
    """Two sims whose GPU cannot hold two prefixes: the CPU tier holds what the GPU evicts."""
    workload = "--workload shared-prefix --groups 4 --prefix-len 160 --questions-per-group 4 --question-len 8"
    stdout, data = bench_cli(
        tmp_path,
        *f"--compare --policies kv-aware,{NO_CREDIT} --workers 2".split(),
        *["--engine-args", "--cache-blocks 16 --cpu-blocks 128 --speedup 20"],
        *f"{workload} --output-len 4 --concurrency 2".split(),
        timeout=240,
    )
    assert "offloaded-tier hit rate" in stdout
    report = (tmp_path / "rep" / "report.md").read_text()
    assert "| offloaded-tier hit rate |" in report  # the summary row
    assert "| hit rate | offloaded-tier hit rate |" in report  # and the per-worker tables
    runs = data["runs"]
    assert [r["label"] for r in runs] == ["kv-aware", NO_CREDIT]
    for run in runs:
        s = run["summary"]
        assert s["completed"] == s["requests"] == 16
        assert s["offload_hit_rate"] is not None and s["prefix_cache_hit_rate"] is not None
        assert run["cache"]["offload_hits"] == pytest.approx(s["offload_hit_rate"] * run["cache"]["queries"])
    # 4 prefixes of 10 blocks, GPUs of 16 blocks: prefixes evicted to the CPU tier come back from it
    assert runs[0]["cache"]["offload_hits"] > 0
