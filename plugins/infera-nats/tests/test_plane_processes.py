"""The production plane across processes: ``infera-run worker sim`` and ``infera-run serve`` meeting
only through a nats-server (discovery, requests and KV events all on NATS)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable, Iterator

import httpx
import pytest

from infera_core.testing.fleet import LauncherProcess
from infera_core.util.nats_server import NatsServer
from infera_core.util.net import free_port

pytest.importorskip("infera_sim")
pytest.importorskip("infera_policies")

PROMPT = " ".join(f"word{i}" for i in range(200))


@pytest.fixture
def plane_env(nats_server: NatsServer) -> Iterator[dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERA_")}
    env.update(
        PYTHONUNBUFFERED="1",
        INFERA_LOAD_PLUGINS="sim,vllm,nats,policies",
        INFERA_DISCOVERY="nats",
        INFERA_NATS_URL=nats_server.url,
        INFERA_LEASE_TTL="3",
    )
    yield env


def worker(env: dict[str, str], name: str) -> LauncherProcess:
    args = ["worker", "sim", "--model", "m", "--worker-id", name]
    args += ["--request-transport", "nats", "--kv-event-transport", "nats", "--", "--speedup", "inf"]
    return LauncherProcess(args, env)


async def poll(check: Callable[[], Awaitable[bool]], within: float) -> None:
    """Await ``check()`` until it is true; fail after ``within`` seconds."""
    async with asyncio.timeout(within):
        while not await check():  # noqa: ASYNC110 (state in other processes, no event to wait on)
            await asyncio.sleep(0.1)


@pytest.mark.slow
async def test_worker_and_serve_processes_serve_traffic_over_nats(plane_env: dict[str, str]) -> None:
    port = free_port()
    procs = [worker(plane_env, "w-a"), worker(plane_env, "w-b")]
    serve = LauncherProcess(["serve", "--port", str(port), "--router-policy", "kv-aware"], plane_env)
    procs.append(serve)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:

            async def both_workers() -> bool:
                try:
                    data = (await client.get("/v1/workers")).json()["data"]
                except (httpx.HTTPError, ValueError, KeyError):
                    return False
                return {w["worker_id"] for w in data if w["status"] == "active"} == {"w-a", "w-b"}

            await poll(both_workers, within=60)
            body = {"model": "m", "prompt": PROMPT, "max_tokens": 2}
            first = await client.post("/v1/completions", json=body)
            assert first.status_code == 200, first.text
            owner = first.headers["x-infera-worker"]

            async def cached() -> bool:
                return bool((await client.get(f"/v1/admin/cache-view/{owner}")).json()["blocks"])

            await poll(cached, within=15)  # the engine's KV events came through JetStream
            picks = {
                (await client.post("/v1/completions", json=body)).headers["x-infera-worker"] for _ in range(4)
            }
            assert picks == {owner}  # kv-aware keeps the cached prefix on its worker
            chat = {
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 3,
                "stream": True,
            }
            async with client.stream("POST", "/v1/chat/completions", json=chat) as r:
                text = "".join([part async for part in r.aiter_text()])
            assert r.status_code == 200 and text.rstrip().endswith("data: [DONE]")

            # a worker's launcher (and with it its responder and engine) killed: the other one serves
            victim = procs[0] if owner == "w-a" else procs[1]
            victim.kill()
            codes = [(await client.post("/v1/completions", json=body)).status_code for _ in range(6)]
            assert codes == [200] * 6
    except BaseException:
        for proc in procs:
            print(proc.output()[-3000:])
        raise
    finally:
        for proc in procs:
            if proc.proc.poll() is None:
                proc.signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(20)
            except Exception:
                proc.kill()
