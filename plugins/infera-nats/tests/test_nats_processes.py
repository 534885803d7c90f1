"""The production plane across processes: ``infera-run worker`` (NATS and HTTP workers side by
side), ``infera-run serve`` and ``infera-run workers``, all on NATS discovery."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx
import pytest

from infera_core.testing.fleet import CliResult, LauncherProcess
from infera_core.util.nats_server import NatsServer
from infera_core.util.net import free_port

pytest.importorskip("infera_nats")
pytest.importorskip("infera_sim")

PLUGINS = {"INFERA_LOAD_PLUGINS": "standin,sim,nats"}


@pytest.mark.slow
async def test_workers_and_a_server_in_separate_processes_serve_a_mixed_fleet(
    nats_server: NatsServer,
    launch_worker: Callable[..., LauncherProcess],
    standin_env: dict[str, str],
    infera_cli: Callable[..., CliResult],
) -> None:
    on_nats = ["--discovery-backend", "nats", "--nats-url", nats_server.url]
    common = ["--model", "sim-model", *on_nats, "--lease-ttl", "3"]
    via_nats = launch_worker(
        "sim",
        *common,
        "--worker-id",
        "w-nats",
        "--request-transport",
        "nats",
        "--kv-event-transport",
        "nats",
        env=PLUGINS,
    )
    via_http = launch_worker("sim", *common, "--worker-id", "w-http", env=PLUGINS)
    port = free_port()
    serve = LauncherProcess(["serve", *on_nats, "--port", str(port)], {**standin_env, **PLUGINS})
    try:
        await via_nats.until_output("w-nats registered", within=60)
        await via_http.until_output("w-http registered", within=60)
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(timeout=30) as client:

            async def healthy() -> bool:
                try:
                    return bool((await client.get(f"{base}/health")).json().get("active_workers") == 2)
                except (httpx.HTTPError, ValueError):
                    return False

            try:
                async with asyncio.timeout(60):
                    while not await healthy():  # noqa: ASYNC110 (polling another process)
                        await asyncio.sleep(0.1)
            except TimeoutError:
                raise AssertionError(serve.output()[-2000:]) from None
            served = []
            for _ in range(6):
                r = await client.post(
                    f"{base}/v1/chat/completions",
                    json={
                        "model": "sim-model",
                        "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 3,
                    },
                )
                assert r.status_code == 200, r.text
                served.append(r.headers["x-infera-worker"])
        assert set(served) == {"w-nats", "w-http"}  # one router, two request transports
        listed = await asyncio.to_thread(infera_cli, "workers", *on_nats, "--json", env=PLUGINS)
        assert listed.code == 0, listed.stderr
        records = {r["worker_id"]: r for r in json.loads(listed.stdout)}
        assert records["w-nats"]["request_transport"] == "nats"
        assert records["w-nats"]["kv_event_transport"] == "nats"
        assert records["w-http"]["request_transport"] == "http"
    finally:
        for proc in (via_nats, via_http, serve):
            if proc.proc.poll() is None:
                proc.signal(15)
        for proc in (via_nats, via_http, serve):
            await proc.exited(within=20)
