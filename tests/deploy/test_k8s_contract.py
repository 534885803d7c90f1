"""The kubernetes backend passes the discovery contract suite, and a real router uses it.

The backend is read-only (pods are the registrations), so the contract's "launcher" side
is played by the cluster: registering creates a Ready pod in the stand-in API server,
``update(status=draining)`` marks it terminating, deregistering deletes it (409-style
duplicate on an existing pod name). The router side is the real backend, over HTTP.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from infera_k8s.discovery import KubernetesDiscovery
from infera_k8s.settings import KubernetesSettings
from infera_k8s.testing import StandinApiServer, make_pod
from infera_sim.testing import start_sim

from infera_core.discovery.base import Discovery, FleetChange, Registration
from infera_core.errors import DiscoveryError
from infera_core.testing.discovery_contract import DiscoveryContract
from infera_core.testing.net import free_port
from infera_core.worker import WorkerRecord


def record_pod(record: WorkerRecord, *, terminating: bool = False) -> dict[str, Any]:
    url = urlsplit(record.url)
    pod = make_pod(
        record.worker_id,
        ip=url.hostname or "127.0.0.1",
        labels={"app.kubernetes.io/component": "infera-worker", "infera.io/engine": record.engine},
        annotations={"infera.io/model": record.model, "infera.io/port": str(url.port)},
    )
    if terminating:
        pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    return pod


class ClusterRegistration:
    def __init__(self, api: StandinApiServer, name: str) -> None:
        self.api, self.name = api, name

    async def update(self, record: WorkerRecord) -> None:
        await self.api.put_pod(record_pod(record, terminating=not record.routable))

    async def deregister(self) -> None:
        if ("default", self.name) in self.api.pods:
            await self.api.delete_pod(self.name)


class PodsAsRegistrations:
    """The real backend; ``register`` stands for "the cluster starts a Ready pod"."""

    def __init__(self, api: StandinApiServer) -> None:
        self.api = api
        settings = KubernetesSettings(k8s_api_server=api.url, k8s_namespace="default", k8s_ready_file="")
        self.inner = KubernetesDiscovery(settings, connect_timeout=2.0)

    async def start(self) -> None:
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()

    async def register(self, record: WorkerRecord) -> Registration:
        if ("default", record.worker_id) in self.api.pods:
            raise DiscoveryError(f"pods {record.worker_id!r} already exists")
        await self.api.put_pod(record_pod(record))
        return ClusterRegistration(self.api, record.worker_id)

    async def list_workers(self) -> list[WorkerRecord]:
        return await self.inner.list_workers()

    def watch(self, *, sync_marker: bool = False) -> AsyncIterator[FleetChange]:
        return self.inner.watch(sync_marker=sync_marker)


async def until_status(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    proc: asyncio.subprocess.Process,
    wanted: Callable[[int], bool],
) -> None:
    """POST ``body`` until the status is ``wanted`` (connection errors count as 0)."""
    async with asyncio.timeout(30):
        while True:
            assert proc.returncode is None, "infera-run serve exited"
            try:
                status = (await client.post(url, json=body)).status_code
            except httpx.HTTPError:
                status = 0
            if wanted(status):
                return
            await asyncio.sleep(0.1)


class TestKubernetesBackend(DiscoveryContract):
    @pytest.fixture(autouse=True)
    async def _api(self) -> AsyncIterator[None]:
        async with StandinApiServer() as api:
            self.api = api
            yield

    async def make_discovery(self) -> Discovery:
        return PodsAsRegistrations(self.api)


async def test_router_serves_a_pod_found_through_the_api() -> None:
    """``infera-run serve --discovery kubernetes`` (settings from INFERA_K8S_*) routes to a sim pod."""
    async with StandinApiServer() as api:
        with start_sim(model="m") as sim:
            await api.put_pod(
                make_pod(
                    "sim-0",
                    ip="127.0.0.1",
                    labels={"app.kubernetes.io/component": "infera-worker", "infera.io/engine": "sim"},
                    annotations={"infera.io/model": "m", "infera.io/port": str(sim.port)},
                )
            )
            port = free_port()
            env = dict(os.environ, INFERA_K8S_API_SERVER=api.url, INFERA_K8S_NAMESPACE="default")
            argv = [
                sys.executable,
                "-m",
                "infera_core",
                "serve",
                "--discovery",
                "kubernetes",
                "--port",
                str(port),
            ]
            proc = await asyncio.create_subprocess_exec(
                *argv, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
            )
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            try:
                async with httpx.AsyncClient(timeout=5.0) as client:
                    await until_status(client, url, body, proc, lambda status: status == 200)
                    await api.delete_pod("sim-0")  # the pod goes: the router stops routing there
                    await until_status(client, url, body, proc, lambda status: status != 200)
            finally:
                proc.terminate()
                await asyncio.wait_for(proc.wait(), 10)
