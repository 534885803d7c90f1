"""Bench input mistakes are one clear line naming the flag or file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from infera_core.bench.config import BenchSettings
from infera_core.bench.plan import make_sessions
from infera_core.bench.stats import parse_slo
from infera_core.errors import ConfigError


def test_slo_parsing_and_errors() -> None:
    slo = parse_slo("ttft=500ms, itl=0.05")
    assert (slo.ttft, slo.itl, slo.e2e) == (0.5, 0.05, None)
    with pytest.raises(ConfigError, match="--slo"):
        parse_slo("latency=3")
    with pytest.raises(ConfigError, match="--slo ttft"):
        parse_slo("ttft=fast")


def test_trace_workload_needs_a_trace_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--trace FILE"):
        make_sessions(BenchSettings(workload="trace"))
    with pytest.raises(ConfigError, match=r"--trace .*nope.jsonl: cannot read"):
        make_sessions(BenchSettings(workload="trace", trace=tmp_path / "nope.jsonl"))


def test_cli_unreachable_url_is_one_line() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "infera_core", "bench", "--url", "http://127.0.0.1:9/v1", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert "--url http://127.0.0.1:9: cannot reach" in out.stderr
    assert "Traceback" not in out.stderr


def test_url_list_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from infera_core.config.settings import resolve

    monkeypatch.setenv("INFERA_URL", "http://a:1/v1, http://b:2/v1")
    assert resolve(BenchSettings, {}).url == ["http://a:1/v1", "http://b:2/v1"]
    assert resolve(BenchSettings, {"url": ("http://c:3/v1",)}).url == ["http://c:3/v1"]  # flag wins
