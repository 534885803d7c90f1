"""``infera-run worker`` SIGTERM with long streams in flight loses none of them.

Two real launchers (``infera-run worker sim``, real etcd) behind a router. A worker that gets
SIGTERM marks its record draining; after ``--drain-grace`` the router moves its streams to the
other worker (``docs/how-to/migration.md``), so the launcher's in-flight count falls to zero, it
deregisters and exits before its ``--drain-timeout`` (shorter than the streams here, so
without the hand-over they would be cut), and every client reads its whole stream.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from typing import Any

import httpx
import pytest

from infera_core.discovery.base import ChangeKind, FleetChange
from infera_core.discovery.view import FleetView
from infera_core.testing.etcd import EtcdServer
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.fleet import LauncherProcess
from infera_core.testing.server import serving, settings_for

pytestmark = pytest.mark.etcd

pytest.importorskip("infera_sim")

MODEL = "sim-model"
TOKENS = 300  # 12 ms each: a stream lasts about 4 s


def launcher(etcd: EtcdServer, worker_id: str) -> LauncherProcess:
    args = ["worker", "sim", "--model", MODEL, "--etcd-endpoint", etcd.url, "--worker-id", worker_id]
    # --drain-timeout 3 s is shorter than the streams: without a hand-over they would be cut
    args += ["--lease-ttl", "3", "--drain-timeout", "3", "--", "--speedup", "1", "--itl-base-ms", "12"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERA_")}
    return LauncherProcess(args, env)


async def whole(c: httpx.AsyncClient, i: int, first_chunk: asyncio.Event, worker: list[str]) -> str | None:
    """One long stream; None when it came whole, else what was wrong."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"story {i}"}],
        "max_tokens": TOKENS,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    usage: dict[str, Any] = {}
    async with c.stream("POST", "/v1/chat/completions", json=body) as r:
        worker.append(r.headers.get("x-infera-worker", ""))
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                return str(event["error"]["message"])
            usage = event.get("usage") or usage
            first_chunk.set()
    return None if usage.get("completion_tokens") == TOKENS else f"usage {usage}"


async def test_sigterm_with_long_streams_loses_none(etcd_server: EtcdServer, etcd_fleet: FleetView) -> None:
    workers = {wid: launcher(etcd_server, wid) for wid in ("w0", "w1")}
    try:
        await etcd_fleet.wait_for(lambda v: v.is_routable("w0") and v.is_routable("w1"), within=60)
        async with serving(settings_for(drain_grace=0.5), make_hooks()) as srv:

            def mirror(change: FleetChange) -> None:  # etcd → the router's fleet
                if change.kind is ChangeKind.PUT and change.record is not None:
                    srv.store.put(change.record)
                elif change.kind is ChangeKind.DELETE:
                    srv.store.delete(change.worker_id)

            etcd_fleet.subscribe(mirror)
            for record in etcd_fleet.workers.values():
                srv.store.put(record)
            await srv.wait_workers(2)
            async with httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
                started = [asyncio.Event() for _ in range(4)]
                served: list[list[str]] = [[] for _ in range(4)]
                streams = [asyncio.create_task(whole(c, i, started[i], served[i])) for i in range(4)]
                for ev in started:
                    await asyncio.wait_for(ev.wait(), 30)
                victim = served[0][0]
                workers[victim].signal(signal.SIGTERM)
                results = await asyncio.gather(*streams)
                assert results == [None] * 4
                assert await workers[victim].exited(within=30) == 0
                out = workers[victim].output()
                assert "no requests in flight" in out and "--drain-timeout" not in out  # handed over, not cut
                metrics = (await c.get("/metrics")).text
                assert 'reason="drain",result="resumed"' in metrics
    finally:
        for proc in workers.values():
            if proc.proc.poll() is None:
                proc.signal(signal.SIGTERM)
                proc.signal(signal.SIGTERM)
                proc.wait(20)
