"""``infera-run worker`` as a subprocess with the stand-in engine and a real etcd."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

import httpx
import pytest

from infera_core.discovery.base import ChangeKind, FleetChange
from infera_core.discovery.view import FleetView
from infera_core.engines.support import metrics_in_flight
from infera_core.testing.etcd import EtcdServer
from infera_core.testing.fleet import LauncherProcess
from infera_core.util.net import free_port
from infera_core.worker import Status

pytestmark = pytest.mark.etcd

Launch = Callable[..., LauncherProcess]


def worker_args(server: EtcdServer, port: int, *extra: str) -> list[str]:
    return ["--model", "m", "--etcd-endpoint", server.url, "--port", str(port), "--worker-id", "w1", *extra]


async def test_register_then_drain_on_sigterm(
    etcd_server: EtcdServer, etcd_fleet: FleetView, launch_worker: Launch
) -> None:
    loop = asyncio.get_running_loop()
    changes: list[tuple[float, FleetChange]] = []
    etcd_fleet.subscribe(lambda c: changes.append((loop.time(), c)))
    port = free_port()
    args = worker_args(etcd_server, port, "--lease-ttl", "3", "--delay", "2", "--", "--startup-delay", "0.1")
    worker = launch_worker("standin", *args)
    registered_at = await worker.until_output("w1 registered", within=30)
    await etcd_fleet.wait_for(lambda v: v.is_routable("w1"), within=1)
    assert loop.time() - registered_at < 1
    record = etcd_fleet.workers["w1"]
    assert (record.url, record.model, record.engine) == (f"http://127.0.0.1:{port}", "m", "standin")
    assert "--startup-delay 0.1" in worker.output()  # flags after -- reach the engine
    assert "[standin:w1] standin engine listening" in worker.output()  # prefixed engine output

    base = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(timeout=20) as client:
        requests = [
            asyncio.create_task(client.post(f"{base}/v1/completions", json={"model": "m", "max_tokens": 2}))
            for _ in range(2)
        ]
        for _ in range(100):
            if await metrics_in_flight(client, base, ["vllm:num_requests_running"]) == 2:
                break
            await asyncio.sleep(0.05)
        sent_term = loop.time()
        worker.signal(signal.SIGTERM)
        await etcd_fleet.wait_for(
            lambda v: "w1" in v.workers and v.workers["w1"].status is Status.DRAINING, within=1
        )
        responses = await asyncio.gather(*requests)
        finished = loop.time()
    assert [r.status_code for r in responses] == [200, 200]
    assert all(r.json()["choices"][0]["text"] for r in responses)
    await etcd_fleet.wait_for(lambda v: "w1" not in v.workers, within=5)
    assert await worker.exited(within=15) == 0
    deleted_at = next(t for t, c in changes if c.kind is ChangeKind.DELETE)
    draining_at = next(t for t, c in changes if c.record is not None and c.record.status is Status.DRAINING)
    # deleted only after the work finished (a launcher ignoring in-flight work would delete ~1 s early)
    assert sent_term <= draining_at < finished <= deleted_at + 0.5


async def test_kill_9_record_expires_within_ttl(
    etcd_server: EtcdServer, etcd_fleet: FleetView, launch_worker: Launch
) -> None:
    port = free_port()
    worker = launch_worker("standin", *worker_args(etcd_server, port, "--lease-ttl", "2"))
    await worker.until_output("w1 registered", within=30)
    await etcd_fleet.wait_for(lambda v: "w1" in v.workers, within=1)
    loop = asyncio.get_running_loop()
    killed = loop.time()
    worker.signal(signal.SIGKILL)
    await etcd_fleet.wait_for(lambda v: "w1" not in v.workers, within=2 + 1)
    assert loop.time() - killed <= 3
    async with httpx.AsyncClient(timeout=1) as client:  # the engine went down with its launcher

        async def engine_down() -> bool:
            try:
                await client.get(f"http://127.0.0.1:{port}/health")
            except httpx.HTTPError:
                return True
            return False

        for _ in range(50):
            if await engine_down():
                break
            await asyncio.sleep(0.1)
        assert await engine_down()


async def test_engine_death_deregisters_and_exits_nonzero(
    etcd_server: EtcdServer, etcd_fleet: FleetView, launch_worker: Launch
) -> None:
    worker = launch_worker("standin", *worker_args(etcd_server, free_port(), "--die-after", "2.5"))
    await worker.until_output("w1 registered", within=30)
    await etcd_fleet.wait_for(lambda v: "w1" in v.workers, within=1)
    code = await worker.exited(within=20)
    # deleted at once: well before the 10 s lease could expire
    await etcd_fleet.wait_for(lambda v: "w1" not in v.workers, within=1)
    out = worker.output()
    assert code != 0
    error = out[out.index("infera-run: error:") :]
    assert "engine standin (worker w1) exited with code 3" in error
    assert "crashing on purpose" in error  # the engine's last log lines
    assert "Traceback" not in out


async def test_failing_health_checks_count_as_a_dead_engine(
    etcd_server: EtcdServer, etcd_fleet: FleetView, launch_worker: Launch
) -> None:
    args = worker_args(etcd_server, free_port(), "--fail-health-after", "2")
    worker = launch_worker("standin", *args, "--health-interval", "0.2", "--health-failures", "3")
    await worker.until_output("w1 registered", within=30)
    code = await worker.exited(within=20)
    assert code != 0 and "engine standin (worker w1) failed 3 health checks in a row" in worker.output()
    await etcd_fleet.wait_for(lambda v: "w1" not in v.workers, within=1)


async def test_second_signal_skips_the_drain_wait(
    etcd_server: EtcdServer, etcd_fleet: FleetView, launch_worker: Launch
) -> None:
    port = free_port()
    worker = launch_worker("standin", *worker_args(etcd_server, port, "--delay", "30", "--stop-timeout", "2"))
    await worker.until_output("w1 registered", within=30)
    async with httpx.AsyncClient(timeout=40) as client:
        request = asyncio.create_task(client.post(f"http://127.0.0.1:{port}/v1/completions", json={}))
        await asyncio.sleep(0.5)
        worker.signal(signal.SIGTERM)
        await worker.until_output("w1: draining", within=5)
        await asyncio.sleep(1.5)
        assert worker.proc.poll() is None  # still waiting for the 30 s request
        loop = asyncio.get_running_loop()
        second = loop.time()
        worker.signal(signal.SIGINT)
        assert await worker.exited(within=10) == 0
        assert loop.time() - second < 6
        request.cancel()
    assert "w1" not in etcd_fleet.workers


async def test_unreachable_etcd_at_startup_is_one_clear_error(launch_worker: Launch) -> None:
    dead = f"127.0.0.1:{free_port()}"
    worker = launch_worker(
        "standin", "--model", "m", "--etcd-endpoint", dead, "--discovery-timeout", "1", "--worker-id", "w1"
    )
    code = await worker.exited(within=20)
    errors = [line for line in worker.output().splitlines() if line.startswith("infera-run: error:")]
    assert code == 1 and len(errors) == 1
    assert "cannot reach etcd" in errors[0] and dead in errors[0]
    assert "Traceback" not in worker.output()
