"""Settings precedence (flag > env > config file > default) and --help naming env vars."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import click
import pytest
from click.testing import CliRunner
from pydantic import Field

from infera_core.config.settings import InferaSettings, click_options, resolve
from infera_core.testing.plugins import run_infera


class DemoSettings(InferaSettings):
    port: int = Field(8000, description="Port to listen on.")
    policy: str = Field("round-robin", description="Routing policy preset.")
    mode: Literal["fast", "safe"] = Field("safe", description="Mode.")
    verbose: bool = Field(False, description="Chatty output.")


@click.command()
@click.option("--config", "config_file", default=None, help="Config file (YAML or JSON).")
@click_options(DemoSettings)
def demo(config_file: str | None, **values: Any) -> None:
    settings = resolve(DemoSettings, values, config_file)
    click.echo(json.dumps(settings.model_dump()))


def _run(args: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    result = CliRunner().invoke(demo, args, env=env or {}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    out: dict[str, Any] = json.loads(result.output)
    return out


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("INFERA_PORT", "INFERA_POLICY", "INFERA_MODE", "INFERA_VERBOSE"):
        monkeypatch.delenv(name, raising=False)


def test_precedence_flag_over_env_over_file_over_default(tmp_path: Path) -> None:
    cfg = tmp_path / "infera.yaml"
    cfg.write_text("port: 9001\npolicy: from-file\nmode: fast\n")
    assert _run([]) == {"port": 8000, "policy": "round-robin", "mode": "safe", "verbose": False}
    assert _run(["--config", str(cfg)])["port"] == 9001
    env = {"INFERA_PORT": "9002", "INFERA_VERBOSE": "true"}
    from_env = _run(["--config", str(cfg)], env=env)
    assert from_env == {"port": 9002, "policy": "from-file", "mode": "fast", "verbose": True}
    flagged = _run(["--config", str(cfg), "--port", "9003", "--no-verbose"], env=env)
    assert flagged == {"port": 9003, "policy": "from-file", "mode": "fast", "verbose": False}


def test_json_config_file(tmp_path: Path) -> None:
    cfg = tmp_path / "infera.json"
    cfg.write_text(json.dumps({"policy": "json-policy"}))
    assert _run(["--config", str(cfg)])["policy"] == "json-policy"


def test_help_shows_env_var_and_default() -> None:
    out = " ".join(CliRunner().invoke(demo, ["--help"]).output.split())  # undo line wrapping
    assert "--port" in out and "[env: INFERA_PORT]" in out and "[default: 8000]" in out
    assert "[env: INFERA_MODE]" in out and "fast" in out


def test_bad_env_value_names_flag_and_env_var() -> None:
    result = CliRunner().invoke(demo, [], env={"INFERA_PORT": "lots"})
    assert result.exit_code != 0
    assert "--port (env INFERA_PORT)" in str(result.exception)


def test_bad_config_file_is_one_clear_error(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("- just\n- a list\n")
    result = CliRunner().invoke(demo, ["--config", str(cfg)])
    assert f"--config {cfg}: expected a mapping" in str(result.exception)


def test_infera_run_help_names_env_vars() -> None:
    proc = run_infera(["--help"])
    assert proc.returncode == 0, proc.stderr
    assert "INFERA_STRICT_PLUGINS" in proc.stdout and "INFERA_LOG_LEVEL" in proc.stdout
    for cmd in ("plugins", "engines", "policies"):
        assert cmd in proc.stdout
