"""One ``INFERA_*`` name per meaning: each command's renamed variables, the old names still
read with one deprecation line, and ``--help`` naming the new ones (docs/configuration.md)."""

from __future__ import annotations

import logging
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from pydantic import BaseModel

from infera_core.bench.config import BenchSettings
from infera_core.cli import build_cli
from infera_core.cli.workers import WorkersSettings
from infera_core.config import settings as settings_module
from infera_core.config.settings import field_options, resolve
from infera_core.engines.settings import WorkerSettings
from infera_core.server.settings import ServeSettings
from infera_core.testing.fixtures import make_hooks
from infera_core.up.settings import UpSettings

RENAMED: list[tuple[type[BaseModel], str, str, str, str, object]] = [
    # model, field, new variable, old variable, value set, value read
    (ServeSettings, "host", "INFERA_ROUTER_HOST", "INFERA_HOST", "0.0.0.0", "0.0.0.0"),
    (ServeSettings, "port", "INFERA_ROUTER_PORT", "INFERA_PORT", "9001", 9001),
    (ServeSettings, "http_client", "INFERA_HTTP_CLIENT", "INFERA_UPSTREAM_TRANSPORT", "aiohttp", "aiohttp"),
    (UpSettings, "host", "INFERA_ROUTER_HOST", "INFERA_HOST", "0.0.0.0", "0.0.0.0"),
    (UpSettings, "port", "INFERA_ROUTER_PORT", "INFERA_PORT", "9001", 9001),
    (UpSettings, "policy", "INFERA_ROUTER_POLICY", "INFERA_POLICY", "random", "random"),
    (WorkerSettings, "host", "INFERA_ENGINE_HOST", "INFERA_HOST", "0.0.0.0", "0.0.0.0"),
    (WorkerSettings, "port", "INFERA_ENGINE_PORT", "INFERA_PORT", "9001", 9001),
    (WorkerSettings, "discovery_prefix", "INFERA_DISCOVERY_PREFIX", "INFERA_ETCD_PREFIX", "/x/", "/x/"),
    (WorkerSettings, "discovery_timeout", "INFERA_DISCOVERY_TIMEOUT", "INFERA_CONNECT_TIMEOUT", "7", 7.0),
    (WorkersSettings, "discovery_prefix", "INFERA_DISCOVERY_PREFIX", "INFERA_ETCD_PREFIX", "/x/", "/x/"),
    (WorkersSettings, "discovery_timeout", "INFERA_DISCOVERY_TIMEOUT", "INFERA_CONNECT_TIMEOUT", "7", 7.0),
    (BenchSettings, "model", "INFERA_BENCH_MODEL", "INFERA_MODEL", "m", "m"),
    (BenchSettings, "workers", "INFERA_BENCH_WORKERS", "INFERA_WORKERS", "3", 3),
    (BenchSettings, "engine", "INFERA_BENCH_ENGINE", "INFERA_ENGINE", "vllm", "vllm"),
    (BenchSettings, "quiet", "INFERA_BENCH_QUIET", "INFERA_QUIET", "true", True),
]
IDS = [f"{m.__name__}.{f}" for m, f, *_ in RENAMED]
VARIABLES = {name for row in RENAMED for name in row[2:4]}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No INFERA_* variable of these tests leaks in from outside; each test warns afresh."""
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(settings_module, "_warned", set())


def _deprecations(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]


@dataclass(frozen=True)
class Renamed:
    model: type[BaseModel]
    field: str
    new: str
    old: str
    raw: str
    value: object

    def read(self) -> object:
        return getattr(self.model(), self.field)


@pytest.fixture(params=[Renamed(*row) for row in RENAMED], ids=IDS)
def renamed(request: pytest.FixtureRequest) -> Renamed:
    """One renamed variable of one command."""
    row: Renamed = request.param
    return row


def test_the_new_variable_sets_the_setting_without_a_warning(
    renamed: Renamed, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(renamed.new, renamed.raw)
    assert renamed.read() == renamed.value
    assert _deprecations(caplog) == []


def test_the_old_variable_still_works_and_warns_once_naming_the_new_one(
    renamed: Renamed, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(renamed.old, renamed.raw)
    with caplog.at_level(logging.WARNING, logger="infera.config"):
        assert renamed.read() == renamed.value
        assert renamed.read() == renamed.value  # read twice, one line
    lines = _deprecations(caplog)
    assert len(lines) == 1 and renamed.old in lines[0] and renamed.new in lines[0], lines


def test_the_new_variable_wins_over_the_old_one(
    renamed: Renamed, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    default = renamed.read()
    monkeypatch.setenv(renamed.new, renamed.raw)
    monkeypatch.setenv(renamed.old, "1" if renamed.raw != "1" else "2")
    assert renamed.read() == renamed.value != default
    assert _deprecations(caplog) == []


def test_a_variable_of_another_command_is_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERA_ROUTER_PORT", "9001")  # the router's, not the engine's
    monkeypatch.setenv("INFERA_BENCH_MODEL", "m")  # what bench sends, not what a worker serves
    assert WorkerSettings().port is None and WorkerSettings().model is None
    monkeypatch.delenv("INFERA_ROUTER_PORT")
    monkeypatch.setenv("INFERA_ENGINE_PORT", "9002")
    assert ServeSettings().port == UpSettings().port == 8000


def test_up_and_serve_read_the_same_policy_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERA_ROUTER_POLICY", "random")
    assert UpSettings().policy == ServeSettings().router_policy == "random"
    assert UpSettings(policy="least-load").policy == "least-load"  # the flag wins


def test_http_client_flag_keeps_the_old_spelling_and_config_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (option,) = [o for o in field_options(ServeSettings.model_fields.items()) if o.name == "http_client"]
    assert option.opts[0] == "--http-client" and "--upstream-transport" in option.opts
    config = tmp_path / "serve.yaml"
    config.write_text("upstream_transport: aiohttp\n")
    with caplog.at_level(logging.WARNING, logger="infera.config"):
        assert resolve(ServeSettings, {}, config).http_client == "aiohttp"
    assert any("'upstream_transport'" in line and "'http_client'" in line for line in _deprecations(caplog))
    config.write_text("upstream_transport: aiohttp\nhttp_client: native\n")
    assert resolve(ServeSettings, {}, config).http_client == "native"


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (["serve", "--help"], ["INFERA_ROUTER_HOST", "INFERA_ROUTER_PORT", "INFERA_HTTP_CLIENT"]),
        (["up", "--help"], ["INFERA_ROUTER_HOST", "INFERA_ROUTER_PORT", "INFERA_ROUTER_POLICY"]),
        (
            ["worker", "sim", "--help"],
            ["INFERA_ENGINE_HOST", "INFERA_ENGINE_PORT", "INFERA_DISCOVERY_TIMEOUT"],
        ),
        (["bench", "--help"], ["INFERA_BENCH_MODEL", "INFERA_BENCH_WORKERS", "INFERA_BENCH_ENGINE"]),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) and v[-1] == "--help" else "",
)
def test_help_shows_the_new_names(argv: list[str], shown: list[str]) -> None:
    result = CliRunner().invoke(build_cli(make_hooks()), argv)
    assert result.exit_code == 0, result.output
    text = "".join(result.output.split())  # help text wraps anywhere
    for name in shown:
        assert f"[env:{name}]" in text, name
    for old in ("[env:INFERA_PORT]", "[env:INFERA_HOST]", "[env:INFERA_UPSTREAM_TRANSPORT]"):
        assert old not in text


def test_one_deprecation_line_on_the_command_line(tmp_path: Path) -> None:
    """What a user sees: the old variable works, and stderr says once what to set instead."""
    env = {"PATH": "", "HOME": str(tmp_path), "INFERA_UPSTREAM_TRANSPORT": "bogus"}
    proc = subprocess.run(
        [sys.executable, "-m", "infera_core", "serve"], env=env, capture_output=True, text=True, timeout=60
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 2, proc.stderr
    assert "INFERA_UPSTREAM_TRANSPORT is deprecated: use INFERA_HTTP_CLIENT" in lines[0]
    assert lines[1].startswith("infera-run: error: --http-client (env INFERA_HTTP_CLIENT)")
