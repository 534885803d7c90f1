"""The kubernetes backend passes the discovery contract suite, and a real router uses it.

Pods are the registrations: the contract's launcher side registers into a pod the
"cluster" has started (the record becomes the pod's annotation), the router side lists and
watches pods; both are the real backend over HTTP against the stand-in API server.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from infera_k8s.discovery import KubernetesDiscovery
from infera_k8s.pods import RECORD_ANNOTATION
from infera_k8s.settings import KubernetesSettings
from infera_k8s.testing import StandinApiServer, make_pod
from infera_sim.testing import start_sim

from infera_core.discovery.base import Discovery, FleetChange, Registration
from infera_core.testing.discovery_contract import DiscoveryContract
from infera_core.util.net import free_port
from infera_core.worker import WorkerRecord


class PodsAsRegistrations:
    """The real backend on both sides. ``register`` first plays the cluster (a Ready pod
    named after the worker, with no Infera annotations), then registers through the
    backend as a launcher in that pod does: the record goes into the pod's annotation."""

    def __init__(self, api: StandinApiServer) -> None:
        self.api = api
        settings = KubernetesSettings(
            k8s_api_server=api.url, k8s_namespace="default", k8s_ready_file="", k8s_retry_max=0.5
        )
        self.inner = KubernetesDiscovery(settings, connect_timeout=2.0)

    async def start(self) -> None:
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()

    async def register(self, record: WorkerRecord) -> Registration:
        if ("default", record.worker_id) not in self.api.pods:
            await self.api.put_pod(
                make_pod(record.worker_id, labels={"app.kubernetes.io/component": "infera-worker"})
            )
        self.inner.settings = self.inner.settings.model_copy(update={"k8s_pod_name": record.worker_id})
        return await self.inner.register(record)

    async def list_workers(self) -> list[WorkerRecord]:
        return await self.inner.list_workers()

    def watch(self, *, sync_marker: bool = False) -> AsyncIterator[FleetChange]:
        return self.inner.watch(sync_marker=sync_marker)

    state_source = "kubernetes"

    async def state_get(self, name: str) -> tuple[bytes | None, int]:
        return await self.inner.state_get(name)

    async def state_swap(self, name: str, value: bytes, revision: int) -> bool:
        return await self.inner.state_swap(name, value, revision)


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

    def stop_backend(self) -> None:
        self.api.set_down(True)

    def start_backend(self) -> None:
        self.api.set_down(False)


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


async def test_launcher_publishes_its_record_on_its_pod_and_drains(tmp_path: Path) -> None:
    """``infera-run worker sim --discovery-backend kubernetes`` in pod ``sim-0``: the record
    (KV-event endpoint picked at launch included) lands on the pod, the ready file appears,
    a router finds and uses it; SIGTERM publishes draining, then removes both."""
    async with StandinApiServer() as api:
        await api.put_pod(
            make_pod("sim-0", ip="127.0.0.1", labels={"app.kubernetes.io/component": "infera-worker"})
        )
        ready = tmp_path / "ready"
        env = dict(
            os.environ,
            INFERA_K8S_API_SERVER=api.url,
            INFERA_K8S_NAMESPACE="default",
            INFERA_K8S_POD_NAME="sim-0",
            INFERA_K8S_READY_FILE=str(ready),
        )
        worker_argv = [sys.executable, "-m", "infera_core", "worker", "sim", "--model", "m"]
        worker_argv += ["--discovery-backend", "kubernetes", "--drain-timeout", "3"]
        worker = await asyncio.create_subprocess_exec(
            *worker_argv, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
        )
        port = free_port()
        serve_argv = [sys.executable, "-m", "infera_core", "serve", "--discovery-backend", "kubernetes"]
        router = await asyncio.create_subprocess_exec(
            *[*serve_argv, "--port", str(port)],
            env=env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        try:
            async with httpx.AsyncClient(timeout=5.0) as client:
                await until_status(client, url, body, router, lambda status: status == 200)
            pod = api.pods[("default", "sim-0")]
            record = WorkerRecord.from_json(pod["metadata"]["annotations"][RECORD_ANNOTATION])
            assert record.kv_events is not None and record.kv_events.endpoint.startswith("tcp://127.0.0.1:")
            assert ready.exists()
            worker.terminate()
            assert await asyncio.wait_for(worker.wait(), 30) == 0
            statuses = [
                json.loads(p["metadata"]["annotations"][RECORD_ANNOTATION])["status"]
                for _, kind, p, _ in api.history
                if kind == "MODIFIED" and RECORD_ANNOTATION in p["metadata"].get("annotations", {})
            ]
            assert statuses[-1] == "draining"  # published before the drain wait
            assert RECORD_ANNOTATION not in api.pods[("default", "sim-0")]["metadata"]["annotations"]
            assert not ready.exists()
        finally:
            for proc in (worker, router):
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()


@pytest.mark.slow  # ~15-20 s: three infera-run processes
async def test_prefill_and_decode_pods_are_paired_from_their_published_records(tmp_path: Path) -> None:
    """The ``pd`` overlay's shape with sims: prefill and decode launchers publish their PD
    records on their pods; the router pairs them (per-launch PD parameters included)."""
    async with StandinApiServer() as api:
        base_env = dict(os.environ, INFERA_K8S_API_SERVER=api.url, INFERA_K8S_NAMESPACE="default")
        procs: list[asyncio.subprocess.Process] = []
        try:
            for role in ("prefill", "decode"):
                pod = f"{role}-0"
                labels = {"app.kubernetes.io/component": "infera-worker", "infera.io/role": role}
                await api.put_pod(make_pod(pod, ip="127.0.0.1", labels=labels))
                env = dict(base_env, INFERA_K8S_POD_NAME=pod, INFERA_K8S_READY_FILE=str(tmp_path / pod))
                argv = [sys.executable, "-m", "infera_core", "worker", "sim", "--model", "m", "--role", role]
                argv += ["--discovery-backend", "kubernetes", "--drain-timeout", "1"]
                procs.append(
                    await asyncio.create_subprocess_exec(
                        *argv, env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
                    )
                )
            port = free_port()
            argv = [sys.executable, "-m", "infera_core", "serve", "--discovery-backend", "kubernetes"]
            router = await asyncio.create_subprocess_exec(
                *argv, "--port", str(port), env=base_env, stdout=asyncio.subprocess.DEVNULL
            )
            procs.append(router)
            body = {"model": "m", "messages": [{"role": "user", "content": "hello " * 20}], "max_tokens": 4}
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10.0) as client:
                url = f"http://127.0.0.1:{port}/v1/chat/completions"
                await until_status(client, url, body, router, lambda status: status == 200)
                resp = await client.post("/v1/chat/completions", json=body)
                assert resp.status_code == 200 and resp.headers["x-infera-worker"] == "decode-0"
                metrics = (await client.get("/metrics")).text
                assert any(
                    line.startswith("infera_pd_pairs_total{") and "prefill-0" in line
                    for line in metrics.splitlines()
                )
        finally:
            for proc in procs:
                if proc.returncode is None:
                    proc.terminate()
                    await asyncio.wait_for(proc.wait(), 30)
