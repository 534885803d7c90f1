"""``--profile FILE``: a timing profile from ``infera-run calibrate`` sets the sim's timing model,
and the virtual-clock sim (``infera-run plan``) times steps with it exactly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from infera_sim.adapter import SimAdapter
from infera_sim.config import parse_args
from infera_sim.virtual import VirtualSim, virtual_config

from infera_core.engines.base import LaunchContext
from infera_core.engines.timing import TimingProfile, VirtualEngines, load_profile
from infera_core.errors import ConfigError, EngineError
from infera_core.testing.contracts import sample_launch_context

PROFILE = {
    "schema": "infera.timing/v1",
    "prefill_tokens_per_s": 4000.0,
    "prefill_base_ms": 12.5,
    "itl_base_ms": 30.0,
    "itl_slope_ms": 1.5,
    "max_num_seqs": 7,
    "block_size": 32,
}


@pytest.fixture
def profile_file(tmp_path: Path) -> Path:
    path = tmp_path / "engine.json"
    path.write_text(json.dumps(PROFILE))
    return path


def test_profile_sets_the_timing_flags_and_explicit_flags_win(profile_file: Path) -> None:
    cfg = parse_args(["--profile", str(profile_file)])
    assert (cfg.prefill_tokens_per_s, cfg.prefill_base_ms) == (4000.0, 12.5)
    assert (cfg.itl_base_ms, cfg.itl_slope_ms, cfg.max_num_seqs, cfg.block_size) == (30.0, 1.5, 7, 32)
    cfg = parse_args(["--itl-base-ms", "3", "--profile", str(profile_file)])
    assert cfg.itl_base_ms == 3.0 and cfg.prefill_tokens_per_s == 4000.0


def test_a_yaml_profile_is_read_too(tmp_path: Path) -> None:
    path = tmp_path / "engine.yaml"
    path.write_text("prefill_tokens_per_s: 1000\nitl_base_ms: 8\n")
    assert load_profile(path).prefill_tokens_per_s == 1000.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (None, "cannot read file"),
        ("{not json", "not valid JSON"),
        ('{"schema": "other/v9", "prefill_tokens_per_s": 1, "itl_base_ms": 1}', "is not infera.timing/v1"),
        ('{"prefill_tokens_per_s": -5, "itl_base_ms": 1}', "prefill_tokens_per_s"),
        ('{"itl_base_ms": 1}', "prefill_tokens_per_s: Field required"),
    ],
)
def test_a_bad_profile_is_one_clear_line(tmp_path: Path, text: str | None, message: str) -> None:
    path = tmp_path / "bad.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError, match=message) as err:
        load_profile(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_the_sim_server_refuses_a_missing_profile_with_a_usage_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "infera_sim.server", "--profile", str(tmp_path / "nope.json")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "--profile" in done.stderr and "cannot read file" in done.stderr
    assert "Traceback" not in done.stderr


def _ctx(tmp_path: Path, **options: object) -> LaunchContext:
    return sample_launch_context(options=options)


def test_worker_sim_profile_option_reaches_the_sim(profile_file: Path, tmp_path: Path) -> None:
    adapter = SimAdapter()
    ctx = _ctx(tmp_path, profile=str(profile_file))
    cfg = adapter.effective_config(ctx)
    assert (cfg.prefill_tokens_per_s, cfg.itl_base_ms, cfg.block_size) == (4000.0, 30.0, 32)
    argv = adapter.build_launch(ctx).argv
    assert argv[argv.index("--profile") + 1] == str(profile_file)
    with pytest.raises(EngineError, match="cannot read file") as err:
        adapter.effective_config(_ctx(tmp_path, profile=str(tmp_path / "missing.json")))
    assert "\n" not in str(err.value)


def test_the_virtual_sim_times_a_prefill_as_base_plus_uncached_tokens_over_rate() -> None:
    profile = TimingProfile.model_validate(PROFILE)
    assert isinstance(SimAdapter(), VirtualEngines)
    sim = VirtualSim(virtual_config(profile, 32, 256), None)
    prompt = list(range(100, 900))  # 800 tokens
    sim.submit("a", prompt, 1, 0.0)
    end = sim.start_step(0.0)
    assert end == pytest.approx(0.0125 + 800 / 4000.0)
    (done,) = sim.end_step(end)
    assert (done.first_token_at, done.cached_tokens) == (end, 0)
    # the same prompt again: 24 blocks of 32 hit, 32 tokens are computed
    sim.submit("b", prompt, 1, 1.0)
    end = sim.start_step(1.0)
    assert end == pytest.approx(1.0 + 0.0125 + 32 / 4000.0)
    (done,) = sim.end_step(end)
    assert done.cached_tokens == 768


def test_the_virtual_sim_decodes_at_base_plus_slope_per_running_request() -> None:
    profile = TimingProfile.model_validate(PROFILE)
    sim = VirtualSim(virtual_config(profile, 32, 256), None)
    for k in range(3):
        sim.submit(f"r{k}", [10 + k] * 64, 5, 0.0)
    t = 0.0
    ends = []
    finished = []
    while (end := sim.start_step(t)) is not None:
        ends.append(end - t)
        t = end
        finished += sim.end_step(t)
    assert ends[0] == pytest.approx(0.0125 + 3 * 64 / 4000.0)
    assert ends[1:] == pytest.approx([(30.0 + 1.5 * 3) / 1000.0] * 4)
    assert sorted(f.output_tokens for f in finished) == [5, 5, 5]
