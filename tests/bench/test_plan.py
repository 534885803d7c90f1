"""``infera-run plan``: replays a trace over simulated fleets in virtual time and answers with
the smallest fleet that meets the SLO (its margin, the attainment curve, a plot, ``--json``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from plan_trace import SLO, write_profile, write_trace

from infera_core.bench.capacity import parse_pd_ratios, parse_plan_slo, parse_workers, split
from infera_core.bench.config import BenchSettings
from infera_core.bench.plan import make_sessions
from infera_core.bench.plan_config import PlanSettings
from infera_core.bench.trace import trace_workload
from infera_core.errors import ConfigError
from infera_core.testing.fleet import CliResult, in_process_cli


@pytest.fixture
def plan_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[..., CliResult]:
    """``infera-run plan …`` in this process (the sim, the policies and the example echo engine
    (no virtual clock) loaded)."""
    run = in_process_cli(Path(__file__).parent, "sim,policies,example_engine", monkeypatch, capsys)
    return lambda *args: run("plan", *args)


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    return write_trace(tmp_path / "t.jsonl"), write_profile(tmp_path / "p.json")


def test_plan_answers_the_smallest_fleet_that_meets_the_slo(
    plan_cli: Callable[..., CliResult], files: tuple[Path, Path], tmp_path: Path
) -> None:
    trace, profile = files
    plot = tmp_path / "plan.png"
    done = plan_cli(
        "--trace", str(trace), "--profile", str(profile), "--slo", SLO, "--workers", "1..3",
        "--plot", str(plot), "--json",
    )  # fmt: skip
    assert done.code == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["workers"] == 2 and out["meets_slo"] is True
    fleets = {f["workers"]: f for f in out["fleets"]}
    assert fleets[1]["meets_slo"] is False and fleets[1]["ttft_p90"] > 1.2  # far behind: queueing
    assert fleets[2]["ttft_p90"] < 0.4 and out["answer"]["margin"] > 0.3
    assert fleets[1]["attainment"] < fleets[2]["attainment"] == 1.0
    assert out["answer"]["ttft_p90"] == fleets[2]["ttft_p90"]
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_plan_tries_pd_splits_and_policies(
    plan_cli: Callable[..., CliResult], files: tuple[Path, Path]
) -> None:
    trace, profile = files
    done = plan_cli(
        "--trace", str(trace), "--profile", str(profile), "--slo", SLO, "--workers", "2,3",
        "--policy", "kv-aware,round-robin", "--pd-ratio", "mixed,1:2", "--json", "--max-requests", "20",
    )  # fmt: skip
    assert done.code == 0, done.stderr
    out = json.loads(done.stdout)
    shapes = {(f["policy"], f["shape"]) for f in out["fleets"]}
    assert shapes == {(p, s) for p in ("kv-aware", "round-robin") for s in ("2", "3", "1P+1D", "1P+2D")}
    assert all(f["requests"] == 20 for f in out["fleets"])


def test_plan_text_output_names_the_fleet_and_margin(
    plan_cli: Callable[..., CliResult], files: tuple[Path, Path]
) -> None:
    trace, profile = files
    done = plan_cli("--trace", str(trace), "--profile", str(profile), "--slo", SLO, "--workers", "1..2")
    assert done.code == 0, done.stderr
    assert "plan: 2 workers" in done.stdout and "margin" in done.stdout


def test_no_fleet_meeting_the_slo_exits_2_with_advice(
    plan_cli: Callable[..., CliResult], files: tuple[Path, Path]
) -> None:
    trace, profile = files
    done = plan_cli(
        "--trace", str(trace), "--profile", str(profile), "--slo", "ttft_p90=1ms", "--workers", "1"
    )
    assert done.code == 2
    assert "no fleet tried meets the SLO" in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--slo", SLO], "--trace is required"),
        (["--trace", "{trace}", "--profile", "{tmp}/none.json", "--slo", SLO], "cannot read file"),
        (["--trace", "{tmp}/none.jsonl", "--profile", "{profile}", "--slo", SLO], "--trace"),
        (["--trace", "{trace}", "--profile", "{profile}", "--slo", "ttft=1s"], "--slo: expected"),
        (["--trace", "{trace}", "--profile", "{profile}", "--slo", SLO, "--workers", "0..2"], "--workers"),
        (["--trace", "{trace}", "--profile", "{profile}", "--slo", SLO, "--policy", "nope"], "nope"),
        (["--trace", "{trace}", "--profile", "{profile}", "--slo", SLO, "--pd-ratio", "2"], "--pd-ratio"),
        (["--trace", "{trace}", "--profile", "{profile}", "--slo", SLO, "--engine", "echo"], "virtual clock"),
    ],
)
def test_bad_input_is_one_line(
    plan_cli: Callable[..., CliResult],
    files: tuple[Path, Path],
    tmp_path: Path,
    args: list[str],
    message: str,
) -> None:
    trace, profile = files
    argv = [a.format(trace=trace, profile=profile, tmp=tmp_path) for a in args]
    done = plan_cli(*argv)
    assert done.code == 1, done.stdout
    assert message in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_parsers() -> None:
    assert [(t.metric, t.pct, t.seconds) for t in parse_plan_slo("ttft_p90=2s, tpot_p99.5=50ms")] == [
        ("ttft", 90.0, 2.0),
        ("tpot", 99.5, 0.05),
    ]
    with pytest.raises(ConfigError, match="METRIC_pNN"):
        parse_plan_slo("ttft_p100=1s")
    assert parse_workers("1..3,8") == [1, 2, 3, 8]
    assert parse_pd_ratios("mixed,1:3") == [None, (1, 3)]
    assert split(4, (1, 3)) == (1, 3) and split(2, (3, 1)) == (1, 1) and split(1, (1, 1)) is None


def test_plan_and_bench_read_the_same_rows_with_the_same_token_ids(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.jsonl", rows=6)
    flags = {"max_requests": 5, "time_scale": 0.5, "max_output_len": 3, "tokens_per_block": 32}
    bench = make_sessions(BenchSettings(workload="trace", trace=trace, **flags))  # type: ignore[arg-type]
    planned = trace_workload(
        trace,
        5,
        0.5,
        max_output_len=3,
        block_tokens=PlanSettings(**flags).tokens_per_block,  # type: ignore[arg-type]
    )
    assert [(s.at, s.turns[0].prompt, s.turns[0].max_tokens) for s in bench] == [
        (s.at, s.turns[0].prompt, s.turns[0].max_tokens) for s in planned
    ]
    assert [len(s.turns[0].prompt) for s in bench] == [500 * 32 // 512] * 5
    assert [s.at for s in bench] == [0.0, 0.1, 0.2, 0.3, 0.4]
