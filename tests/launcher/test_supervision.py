"""Supervision: a killed engine comes back (``--restart-engine on-failure``), a hung one leaves
rotation (the one-token generation check) while a slow one stays."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from infera_core.config.settings import resolve
from infera_core.discovery.base import ChangeKind, FleetChange
from infera_core.discovery.memory import MemoryDiscovery, MemoryStore
from infera_core.discovery.view import FleetView
from infera_core.engines.base import RunningEngine
from infera_core.engines.settings import RestartPolicy, WorkerSettings
from infera_core.errors import EngineError
from infera_core.launcher.health import GenerationWatch, checks_generation
from infera_core.launcher.health import health_generate as health_generate_check
from infera_core.launcher.restart import WorkerState
from infera_core.launcher.runtime import WorkerLauncher
from infera_core.testing.contracts import sample_launch_context
from infera_core.testing.etcd import EtcdServer
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.fleet import CliResult, LauncherProcess
from infera_core.up.settings import UpSettings
from infera_core.util.net import free_port
from infera_core.worker import Role, Status

pytest.importorskip("infera_sim")

Launch = Callable[..., LauncherProcess]


async def _engine_pid(url: str) -> int:
    async with httpx.AsyncClient(timeout=10) as client:
        return int((await client.get(f"{url}/sim/info")).json()["pid"])


async def _complete(url: str) -> int:
    async with httpx.AsyncClient(timeout=30) as client:
        body = {"model": "m", "prompt": "a b c", "max_tokens": 2}
        return (await client.post(f"{url}/v1/completions", json=body)).status_code


@pytest.mark.etcd
@pytest.mark.slow
async def test_killed_engine_is_deregistered_restarted_and_registered_again(
    etcd_server: EtcdServer, etcd_fleet: FleetView, launch_worker: Launch
) -> None:
    changes: list[FleetChange] = []
    etcd_fleet.subscribe(changes.append)
    worker = launch_worker(
        "sim",
        *("--model", "m", "--etcd-endpoint", etcd_server.url, "--worker-id", "w1"),
        *("--restart-engine", "on-failure", "--restart-backoff", "0.2"),
        *("--", "--speedup", "inf"),
        env={"INFERA_MAX_RESTARTS": "3", "INFERA_LOAD_PLUGINS": "sim"},
    )
    await worker.until_output("w1 registered", within=60)
    await etcd_fleet.wait_for(lambda v: v.is_routable("w1"), within=5)
    url = etcd_fleet.workers["w1"].url
    first_pid = await _engine_pid(url)

    os.kill(first_pid, signal.SIGKILL)
    await worker.until_output("restarting in 0.2s (restart 1 in a row, at most 3)", within=30)
    await etcd_fleet.wait_for(lambda v: any(c.kind is ChangeKind.DELETE for c in changes), within=10)
    await etcd_fleet.wait_for(lambda v: v.is_routable("w1"), within=60)
    assert etcd_fleet.workers["w1"].url == url  # same port, same id
    assert await _complete(url) == 200
    assert await _engine_pid(url) != first_pid

    worker.signal(signal.SIGTERM)
    assert await asyncio.to_thread(worker.proc.wait, 30) == 0
    await etcd_fleet.wait_for(lambda v: "w1" not in v.workers, within=10)


async def test_restarts_stop_after_max_restarts_in_a_row() -> None:
    launcher = WorkerLauncher(
        make_hooks(("standin", "infera_core.testing.standin_plugin")),
        "standin",
        WorkerSettings(
            model="m",
            worker_id="crashy",
            restart_engine=RestartPolicy.ON_FAILURE,
            max_restarts=2,
            restart_backoff=0.1,
            health_interval=0.2,
        ),
        options={"die_after": 2.5},
        discovery=MemoryDiscovery(MemoryStore()),
        echo=lambda line: None,
    )
    spawned: list[int] = []
    launcher._on_spawn = spawned.append
    with pytest.raises(EngineError, match=r"exited with code 3"):
        await asyncio.wait_for(launcher.run(), 120)
    assert launcher.restarts == 2 and len(set(spawned)) == 3
    assert launcher.state is WorkerState.FAILED


async def test_never_restart_is_the_default_and_exits_with_the_engine_error() -> None:
    assert WorkerSettings().restart_engine is RestartPolicy.NEVER
    launcher = WorkerLauncher(
        make_hooks(("standin", "infera_core.testing.standin_plugin")),
        "standin",
        WorkerSettings(model="m", worker_id="once", health_interval=0.2),
        options={"die_after": 2.5},
        discovery=MemoryDiscovery(MemoryStore()),
        echo=lambda line: None,
    )
    with pytest.raises(EngineError, match=r"exited with code 3"):
        await asyncio.wait_for(launcher.run(), 60)
    assert launcher.restarts == 0


async def test_generation_watch_flips_after_failures_in_a_row_and_back_on_success() -> None:
    results = iter([True, False, True, False, False, False, True])
    flips: list[bool] = []
    done = asyncio.Event()

    async def check() -> bool:
        try:
            return next(results)
        except StopIteration:
            done.set()
            return True

    async def on_change(healthy: bool) -> None:
        flips.append(healthy)

    watch = GenerationWatch(check, on_change, worker_id="w", interval=0.001, failures=2)
    task = asyncio.create_task(watch.run())
    await asyncio.wait_for(done.wait(), 10)
    task.cancel()
    assert flips == [False, True]  # one failure alone does not count


def _sim(worker_id: str, store: MemoryStore, *engine_args: str) -> WorkerLauncher:
    return WorkerLauncher(
        make_hooks(),
        "sim",
        WorkerSettings(model="m", worker_id=worker_id, drain_timeout=0.5, stop_timeout=2),
        engine_args=list(engine_args),
        discovery=MemoryDiscovery(store),
        echo=lambda line: None,
    )


@pytest.mark.slow
async def test_hung_worker_leaves_rotation_within_30s_by_default_and_a_slow_one_stays() -> None:
    store = MemoryStore()
    view = FleetView(MemoryDiscovery(store))
    await view.start()
    statuses: list[tuple[str, Status]] = []
    view.subscribe(lambda c: statuses.append((c.worker_id, c.record.status)) if c.record else None)
    hung = _sim("hung", store, "--fault-hang")
    slow = _sim("slow", store, "--itl-base-ms", "2500")  # every token takes 2.5 s
    tasks = [asyncio.create_task(lc.run()) for lc in (hung, slow)]
    try:
        await asyncio.gather(hung.wait_registered(60), slow.wait_registered(60))
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await view.wait_for(
            lambda v: "hung" in v.workers and v.workers["hung"].status is Status.DRAINING, within=40
        )
        assert loop.time() - t0 < 30
        assert hung.state is WorkerState.UNHEALTHY
        await _wait_checks(slow, 4, within=40)
        assert ("slow", Status.DRAINING) not in statuses and view.is_routable("slow")
        assert await _complete(view.workers["slow"].url) == 200
    finally:
        for lc in (hung, slow):
            await lc.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        await view.stop()


async def _wait_checks(launcher: WorkerLauncher, n: int, within: float) -> None:
    """Until the sim behind ``launcher`` has seen ``n`` generation checks."""
    assert launcher.context is not None
    url = launcher.context.url
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    async with httpx.AsyncClient(timeout=5) as client:
        while True:
            text = (await client.get(f"{url}/metrics")).text
            done = sum(
                float(line.split()[-1])
                for line in text.splitlines()
                if line.startswith("vllm:request_success_total")
            )
            if done >= n:
                return
            assert loop.time() < deadline, f"only {done} generation checks answered within {within}s"
            await asyncio.sleep(0.5)


def test_restart_and_generation_settings_come_from_flag_env_and_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "worker.yaml"
    config.write_text("restart_engine: on-failure\nmax_restarts: 7\nhealth_generate_interval: 0\n")
    s = resolve(WorkerSettings, {}, config)
    assert (s.restart_engine, s.max_restarts, s.health_generate_interval) == (RestartPolicy.ON_FAILURE, 7, 0)
    monkeypatch.setenv("INFERA_MAX_RESTARTS", "9")
    monkeypatch.setenv("INFERA_RESTART_ENGINE", "never")
    s = resolve(WorkerSettings, {"health_generate_timeout": 3.0}, config)
    assert (s.restart_engine, s.max_restarts, s.health_generate_timeout) == (RestartPolicy.NEVER, 9, 3.0)
    monkeypatch.delenv("INFERA_RESTART_ENGINE")
    up = resolve(UpSettings, {"max_restarts": 2}, None)
    assert (up.restart_engine, up.max_restarts) == (RestartPolicy.ON_FAILURE, 2)  # up restarts by default


async def test_a_frozen_engine_leaves_rotation_and_comes_back_when_it_answers_again() -> None:
    store = MemoryStore()
    view = FleetView(MemoryDiscovery(store))
    await view.start()
    launcher = WorkerLauncher(
        make_hooks(),
        "sim",
        WorkerSettings(
            model="m",
            worker_id="frozen",
            health_failures=1000,  # only the generation check may notice
            health_generate_interval=0.5,
            health_generate_timeout=1.0,
            drain_timeout=0.5,
        ),
        engine_args=["--speedup", "inf"],
        discovery=MemoryDiscovery(store),
        echo=lambda line: None,
    )
    task = asyncio.create_task(launcher.run())
    try:
        await launcher.wait_registered(60)
        assert launcher.process is not None and launcher.process.pid is not None
        pid = launcher.process.pid
        os.kill(pid, signal.SIGSTOP)  # accepts connections (the kernel does), answers nothing
        try:
            await view.wait_for(lambda v: v.workers["frozen"].status is Status.DRAINING, within=20)
            assert launcher.state is WorkerState.UNHEALTHY
        finally:
            os.kill(pid, signal.SIGCONT)
        await view.wait_for(lambda v: v.is_routable("frozen"), within=20)
        assert WorkerState(launcher.state) is WorkerState.SERVING and launcher.restarts == 0
    finally:
        await launcher.stop()
        await asyncio.gather(task, return_exceptions=True)
        await view.stop()


def test_pd_legs_get_generation_checks_only_when_their_adapter_says_how() -> None:
    from infera_sim.adapter import SimAdapter

    assert checks_generation(SimAdapter(), Role.MIXED)
    assert not checks_generation(SimAdapter(), Role.PREFILL)  # a plain request may wait for a KV transfer
    sglang = pytest.importorskip("infera_sglang.adapter")
    assert checks_generation(sglang.SglangAdapter(), Role.DECODE)


async def test_sglang_adapter_uses_the_engines_own_health_generate() -> None:
    from aiohttp import web

    sglang = pytest.importorskip("infera_sglang.adapter")
    answers = [200, 503]

    async def health_generate(request: web.Request) -> web.Response:
        return web.Response(status=answers.pop(0))

    app = web.Application()
    app.router.add_get("/health_generate", health_generate)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        adapter = sglang.SglangAdapter()
        async with httpx.AsyncClient() as client:
            engine = RunningEngine(sample_launch_context(port=port), client)
            assert await health_generate_check(adapter, engine, within=5)
            assert not await health_generate_check(adapter, engine, within=5)
    finally:
        await runner.cleanup()


def test_worker_help_shows_the_supervision_flags(infera_cli: Callable[..., CliResult]) -> None:
    out = infera_cli("worker", "standin", "--help")
    text = " ".join(out.stdout.split())
    for env_var in (
        "INFERA_RESTART_ENGINE",
        "INFERA_MAX_RESTARTS",
        "INFERA_RESTART_BACKOFF",
        "INFERA_HEALTH_GENERATE_INTERVAL",
        "INFERA_HEALTH_GENERATE_TIMEOUT",
    ):
        assert env_var in text
    assert "on-failure" in text
