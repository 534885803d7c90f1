"""The launcher as a library (what ``infera-run up`` does) and the ``infera-run worker`` CLI surface."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from infera_core.cli.alias import main_for
from infera_core.discovery.memory import MemoryDiscovery, MemoryStore
from infera_core.discovery.view import FleetView
from infera_core.engines.base import EngineRegistry, LaunchContext, LaunchSpec, RunningEngine
from infera_core.engines.settings import WorkerSettings
from infera_core.errors import ConfigError, DiscoveryError, EngineError
from infera_core.launcher.address import advertise_host, is_loopback
from infera_core.launcher.runtime import WorkerLauncher
from infera_core.plugin.hooks import InferaHooks
from infera_core.plugin.spec import hookimpl
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.fleet import CliResult
from infera_core.testing.standin_plugin import StandinAdapter
from infera_core.worker import Role, Status


def hooks() -> InferaHooks:
    return make_hooks(("standin", "infera_core.testing.standin_plugin"))


async def test_several_launchers_in_one_process_with_memory_discovery() -> None:
    store = MemoryStore()
    router = MemoryDiscovery(store)
    view = FleetView(router)
    await view.start()
    lines: list[str] = []
    launchers = [
        WorkerLauncher(
            hooks(),
            "standin",
            WorkerSettings(model="m", worker_id=f"w{i}", role=Role.DECODE, labels="zone=a", drain_timeout=5),
            discovery=MemoryDiscovery(store),
            echo=lines.append,
        )
        for i in range(2)
    ]
    tasks = [asyncio.create_task(launcher.run()) for launcher in launchers]
    records = [await launcher.wait_registered(within=30) for launcher in launchers]
    await view.wait_for(lambda v: len(v.routable()) == 2, within=1)
    assert {r.worker_id for r in records} == {"w0", "w1"}
    assert records[0].role is Role.DECODE and records[0].labels == {"standin": "1", "zone": "a"}
    assert records[0].engine_version == "0.0-standin"
    async with httpx.AsyncClient() as client:
        assert (await client.get(f"{records[0].url}/health")).status_code == 200
    assert any(line.startswith("[standin:w0] ") for line in lines)

    stopping = asyncio.create_task(launchers[0].stop())
    await view.wait_for(lambda v: "w0" in v.workers and v.workers["w0"].status is Status.DRAINING, within=1)
    await stopping
    assert await tasks[0] == 0
    assert set(view.workers) == {"w1"}
    await launchers[1].stop()
    assert await tasks[1] == 0 and not view.workers
    await view.stop()


async def test_engine_failure_raises_engine_error_naming_engine_and_code() -> None:
    launcher = WorkerLauncher(
        hooks(),
        "standin",
        WorkerSettings(model="m", worker_id="dies", discovery="memory"),
        options={"die_after": 0.8},
        discovery=MemoryDiscovery(MemoryStore()),
        echo=lambda line: None,
    )
    with pytest.raises(EngineError, match=r"engine standin \(worker dies\) exited with code 3"):
        await launcher.run()


async def test_engine_never_ready_times_out() -> None:
    launcher = WorkerLauncher(
        hooks(),
        "standin",
        WorkerSettings(model="m", worker_id="slow", ready_timeout=1.5),
        options={"fail_health": True},
        discovery=MemoryDiscovery(MemoryStore()),
        echo=lambda line: None,
    )
    with pytest.raises(EngineError, match=r"was not ready after --ready-timeout 1.5s"):
        await launcher.run()
    assert launcher.process is not None and launcher.process.returncode is not None  # engine stopped


async def test_missing_model_is_a_config_error() -> None:
    launcher = WorkerLauncher(hooks(), "standin", WorkerSettings(discovery="memory"))
    with pytest.raises(ConfigError, match="--model"):
        await launcher.run()


def test_advertise_host_defaults() -> None:
    assert advertise_host("127.0.0.1") == "127.0.0.1"
    assert advertise_host("localhost") == "127.0.0.1"
    assert advertise_host("10.1.2.3") == "10.1.2.3"
    assert advertise_host("0.0.0.0", "worker-7.example") == "worker-7.example"
    assert not is_loopback(advertise_host("0.0.0.0")) or advertise_host("0.0.0.0") == "127.0.0.1"


def test_worker_help_names_env_vars_and_the_double_dash(infera_cli: Callable[..., CliResult]) -> None:
    out = infera_cli("worker", "standin", "--help")
    assert out.code == 0
    text = " ".join(out.stdout.split())
    assert "Everything after -- is passed to the engine" in text
    for env_var in ("INFERA_MODEL", "INFERA_ETCD_ENDPOINT", "INFERA_DRAIN_TIMEOUT", "INFERA_DELAY"):
        assert env_var in text


def test_unknown_engine_lists_the_installed_ones(infera_cli: Callable[..., CliResult]) -> None:
    out = infera_cli("worker", "nosuch", "--model", "m")
    assert out.code == 1
    assert out.stderr.startswith("infera-run: error: unknown engine 'nosuch'; available:")
    assert "standin" in out.stderr and "Traceback" not in out.stderr


def test_bad_flags_are_one_clear_line(infera_cli: Callable[..., CliResult]) -> None:
    out = infera_cli(
        "worker", "standin", "--model", "m", "--discovery", "memory", "--engine-binary", "/no/such/bin"
    )
    assert out.code == 1
    (line,) = [ln for ln in out.stderr.splitlines() if ln.startswith("infera-run: error:")]
    assert "/no/such/bin is not installed" in line and "pip install" in line
    out = infera_cli("worker", "standin", "--model", "m")
    assert out.code == 1 and "--etcd-endpoint" in out.stderr and "--discovery" in out.stderr
    out = infera_cli(
        "worker", "standin", "--model", "m", "--discovery", "memory", env={"INFERA_LEASE_TTL": "-1"}
    )
    assert out.code == 1 and "--lease-ttl (env INFERA_LEASE_TTL)" in out.stderr
    out = infera_cli("worker", "standin", "--model", "m", "--discovery", "static")
    assert out.code == 1 and "read-only" in out.stderr


def test_python_dash_m_alias_is_infera_run_worker(
    infera_cli: Callable[..., CliResult], capsys: pytest.CaptureFixture[str]
) -> None:
    infera_cli()  # sets up the environment (standin installed)
    with pytest.raises(SystemExit) as exit_:
        main_for("standin")(["--help"])
    assert exit_.value.code in (0, None)
    assert "Run the standin engine as a fleet worker" in " ".join(capsys.readouterr().out.split())


class _NoInFlightCount(StandinAdapter):
    """An engine that does not report in-flight requests."""

    async def in_flight(self, engine: RunningEngine) -> int | None:
        return None


class _NoInFlightPlugin:
    @hookimpl
    def infera_register_engines(self, registry: EngineRegistry) -> None:
        registry.add(_NoInFlightCount())


async def test_unknown_in_flight_waits_for_the_drain_timeout() -> None:
    launcher = WorkerLauncher(
        make_hooks(("no-count", _NoInFlightPlugin())),
        "standin",
        WorkerSettings(model="m", worker_id="blind", drain_timeout=2.0),
        discovery=MemoryDiscovery(MemoryStore()),
        echo=lambda line: None,
    )
    task = asyncio.create_task(launcher.run())
    await launcher.wait_registered(within=30)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await launcher.stop()
    assert await task == 0
    assert loop.time() - t0 >= 2.0  # no count → it cannot know the engine is idle


class _AddsEngineFlag:
    @hookimpl
    def infera_mutate_engine_launch(self, context: LaunchContext, spec: LaunchSpec) -> None:
        spec.argv += ["--startup-delay", "0.2"]
        spec.env["STANDIN_MUTATED"] = context.worker_id


async def test_mutation_hook_adjusts_the_launch_and_duplicate_ids_are_refused() -> None:
    store = MemoryStore()
    hooks = make_hooks(("standin", "infera_core.testing.standin_plugin"), ("mutator", _AddsEngineFlag()))
    lines: list[str] = []

    def launcher() -> WorkerLauncher:  # worker id "dup" in the one store
        settings = WorkerSettings(model="m", worker_id="dup")
        return WorkerLauncher(hooks, "standin", settings, discovery=MemoryDiscovery(store), echo=lines.append)

    first = launcher()
    task = asyncio.create_task(first.run())
    await first.wait_registered(within=30)
    assert first.process is not None
    assert first.process.spec.argv[-2:] == ["--startup-delay", "0.2"]
    assert first.process.spec.env["STANDIN_MUTATED"] == "dup"
    second = launcher()
    with pytest.raises(DiscoveryError, match="'dup' is already registered"):
        await second.run()
    assert second.process is not None and second.process.returncode is not None  # its engine was stopped
    assert [r.url for r in store.records.values()] == [first.context.url if first.context else ""]
    await first.stop()
    assert await task == 0


def test_config_file_feeds_infera_settings_and_engine_options(
    tmp_path: Path, infera_cli: Callable[..., CliResult]
) -> None:
    config = tmp_path / "worker.yaml"
    config.write_text("model: m\ndiscovery: memory\nengine_binary: /from/config/file\n")
    out = infera_cli("worker", "standin", "--config", str(config))
    assert out.code == 1 and "/from/config/file is not installed" in out.stderr
    out = infera_cli("worker", "standin", "--config", str(config), "--engine-binary", "/from/flag")
    assert out.code == 1 and "/from/flag is not installed" in out.stderr  # the flag wins
