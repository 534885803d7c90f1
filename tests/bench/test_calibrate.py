"""``infera-run calibrate`` measures a running engine: against a sim with known timing flags it
recovers them, writes a profile a sim reads back, and bad input is one clear line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from infera_sim.config import parse_args
from infera_sim.testing import start_sim

from infera_core.bench.calibrate import Calibrator, fit_line
from infera_core.engines.timing import load_profile
from infera_core.testing.fleet import CliResult, in_process_cli

TIMING = {"prefill_tokens_per_s": 5000.0, "prefill_base_ms": 40.0, "itl_base_ms": 25.0, "itl_slope_ms": 4.0}


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[..., CliResult]:
    return in_process_cli(Path(__file__).parent, "sim,policies", monkeypatch, capsys)


def test_calibrate_recovers_a_sims_timing_and_the_profile_round_trips(
    cli: Callable[..., CliResult], tmp_path: Path
) -> None:
    out = tmp_path / "sim.json"
    with start_sim(block_size=16, **TIMING) as sim:
        done = cli(
            "calibrate", "--url", sim.url + "/v1", "--out", str(out), "--prompt-lens", "128,512,1024",
            "--batch-sizes", "1,4,8", "--decode-tokens", "12", "--repeats", "2",
        )  # fmt: skip
    assert done.code == 0, done.stderr
    assert f"profile written to {out}" in done.stderr
    profile = load_profile(out)
    assert profile.model == "sim-model"
    # the probe sees the sim's step times plus HTTP and a busy host: generous bounds, but a
    # wrong fit (tokens vs seconds, ms vs s, cached tokens counted as computed) is far outside
    assert 3500 <= profile.prefill_tokens_per_s <= 6500, profile
    assert 20 <= profile.prefill_base_ms <= 90, profile
    assert 15 <= profile.itl_base_ms <= 45, profile
    assert 1.5 <= profile.itl_slope_ms <= 7, profile
    points = profile.samples["prefill_uncached_tokens_ttft_s"]
    assert {p[0] for p in points} >= {128.0, 512.0, 1024.0, 16.0}  # repeats: only the last block
    cfg = parse_args(["--profile", str(out)])
    assert cfg.prefill_tokens_per_s == profile.prefill_tokens_per_s
    assert cfg.itl_slope_ms == profile.itl_slope_ms


def test_fit_line_ignores_a_few_slowed_points() -> None:
    points = [(x, 0.01 + x / 5000) for x in (100.0, 200.0, 400.0, 800.0, 1600.0)]
    points.append((400.0, 3.0))  # a busy spell
    base, slope = fit_line(points)
    assert slope == pytest.approx(1 / 5000, rel=0.05) and base == pytest.approx(0.01, abs=0.005)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "--url is required"),
        (["--url", "127.0.0.1:8000"], "expected an http(s) URL"),
        (["--url", "http://127.0.0.1:9/v1"], "cannot reach the engine"),
        (["--url", "http://127.0.0.1:9/v1", "--prompt-lens", "a,b"], "--prompt-lens"),
    ],
)
def test_bad_input_is_one_line(cli: Callable[..., CliResult], args: list[str], message: str) -> None:
    done = cli("calibrate", *args)
    assert done.code == 1
    assert message in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_each_calibration_sends_fresh_prompts() -> None:
    """A second calibration of the same engine must not find the first one's prompts cached."""
    client = httpx.AsyncClient()
    first = Calibrator(client, "http://e/v1", "m", 1000).prompt(64)
    second = Calibrator(client, "http://e/v1", "m", 1000).prompt(64)
    assert first != second and all(10 <= t < 1000 for t in first + second)
