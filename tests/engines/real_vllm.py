"""Helpers for the real-vLLM tests: the venv built by ``.ci/steps/20-vllm-venv.sh``, launcher
subprocesses running real vLLM, etcd reads, KV event subscription and ``/metrics`` parsing."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import zmq
from engine_env import clean_environ

from infera_core.discovery.base import DiscoverySettings
from infera_core.discovery.etcd import EtcdDiscovery
from infera_core.engines.support import metrics_sum
from infera_core.errors import DiscoveryError
from infera_core.kv.events import BlockStored, KvEventDecoder
from infera_core.testing.etcd import EtcdServer
from infera_core.testing.fixtures import make_hooks
from infera_core.testing.fleet import LauncherProcess
from infera_core.util.net import free_port, wait_port
from infera_core.worker import WorkerRecord

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv-vllm"
ENGINE_ARGS = ["--max-model-len", "2048", "--enforce-eager", "--kv-cache-memory-bytes", "67108864"]
BLOCK = 32
START_TIMEOUT = 420.0
"""vLLM starts in 20-60 s on an idle 2-core machine; much slower when the cores are shared."""


def kv_aware_flags() -> list[str]:
    """``infera-run serve`` flags for KV-aware routing of the tiny model."""
    _, model = vllm_python()
    return [
        "--router-policy",
        "kv-aware",
        "--tokenizer",
        f"tiny=hf:{model}",
        "--kv-block-size",
        f"tiny={BLOCK}",
    ]


def vllm_python() -> tuple[str, str]:
    """(engine python, tiny model dir), or a visible skip when the venv was not built."""
    python = os.environ.get("INFERA_VLLM_PYTHON") or str(VENV / "bin" / "python")
    model = str(VENV / "tiny")
    if not os.environ.get("INFERA_VLLM_PYTHON") and not (VENV / "READY").exists():
        pytest.skip("real vLLM venv not built (.venv-vllm/READY missing): run bash .ci/steps/20-vllm-venv.sh")
    if not (Path(model) / "config.json").exists():
        pytest.skip(f"tiny model missing at {model}: run bash .ci/steps/20-vllm-venv.sh")
    return python, model


def engine_env(cache_root: Path) -> dict[str, str]:
    env = clean_environ()
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # with --kv-cache-memory-bytes it must be unset
    env.update(
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        VLLM_CACHE_ROOT=str(cache_root),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        PYTHONUNBUFFERED="1",
    )
    return env


@pytest.fixture
def vllm_worker(tmp_path: Path, etcd_server: EtcdServer) -> Iterator[Callable[..., LauncherProcess]]:
    """``vllm_worker("w1")`` → ``infera-run worker vllm`` running real vLLM, registered in etcd."""
    python, model = vllm_python()
    started: list[LauncherProcess] = []

    def launch(worker_id: str, *extra: str) -> LauncherProcess:
        args = [
            "worker",
            "vllm",
            "--model",
            "tiny",
            "--model-path",
            model,
            "--worker-id",
            worker_id,
            "--block-size",
            str(BLOCK),
            "--engine-python",
            python,
            "--etcd-endpoint",
            etcd_server.endpoint,
            "--lease-ttl",
            "3",
            "--drain-timeout",
            "120",
            *extra,
            "--",
            *ENGINE_ARGS,
        ]
        proc = LauncherProcess(args, engine_env(tmp_path / f"vllm-cache-{worker_id}"))
        started.append(proc)
        return proc

    yield launch
    for proc in started:
        stop_launcher(proc)


def stop_launcher(proc: LauncherProcess) -> None:
    """Stop a launcher and make sure its engine is gone (vLLM ignores SIGTERM while it starts)."""
    if proc.proc.poll() is None:
        proc.signal(signal.SIGTERM)
        proc.signal(signal.SIGTERM)  # a second signal skips the drain wait
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
    for pid in re.findall(r"engine vllm started \(pid (\d+)\)", proc.output()):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(int(pid), signal.SIGKILL)


class Server:
    """``infera-run serve`` with etcd discovery, as a subprocess."""

    def __init__(self, etcd: EtcdServer, log: Path, *extra: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log.open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "infera_core",
                "serve",
                "--port",
                str(self.port),
                "--discovery",
                "etcd",
                "--etcd-endpoint",
                etcd.endpoint,
                *extra,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        wait_port("127.0.0.1", self.port, 30)

    def wait_workers(self, ids: set[str], within: float = 30) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            listed = httpx.get(f"{self.url}/v1/workers", timeout=5).json()
            rows = listed.get("data", listed) if isinstance(listed, dict) else listed
            if ids <= {row.get("worker_id") for row in rows}:
                return
            time.sleep(0.2)
        raise AssertionError(f"server never saw workers {ids}")

    def post_completion(self, prompt: str, max_tokens: int = 4) -> httpx.Response:
        body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        response = httpx.post(f"{self.url}/v1/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
        return response

    def cache_view(self, worker_id: str) -> dict[str, Any]:
        response = httpx.get(f"{self.url}/v1/admin/cache-view/{worker_id}", timeout=5)
        assert response.status_code == 200, response.text
        view: dict[str, Any] = response.json()
        return view

    def wait_cached(self, worker_id: str, blocks: int, within: float = 15) -> dict[str, Any]:
        """The router's view of ``worker_id`` once it mirrors at least ``blocks`` blocks."""
        deadline = time.monotonic() + within
        while True:
            view = self.cache_view(worker_id)
            if int(view.get("blocks", 0)) >= blocks:
                return view
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"router mirrors {view.get('blocks')} < {blocks} blocks of {worker_id}: {view}"
                )
            time.sleep(0.2)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture
def serve(etcd_server: EtcdServer, tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """``serve(*flags)`` → ``infera-run serve`` with etcd discovery (stopped at teardown)."""
    started: list[Server] = []

    def make(*extra: str) -> Server:
        server = Server(etcd_server, tmp_path / f"serve-{len(started)}.log", *extra)
        started.append(server)
        return server

    yield make
    for server in started:
        server.close()


def etcd_workers(etcd: EtcdServer) -> dict[str, WorkerRecord]:
    """The workers registered in ``etcd`` now (a fresh client: connecting may take a while
    while vLLM engines start on the same loaded cores, hence the generous connect timeout)."""

    async def read() -> list[WorkerRecord]:
        settings = DiscoverySettings(etcd_endpoints=[etcd.endpoint], connect_timeout=30.0)
        discovery = EtcdDiscovery(settings)
        await discovery.start()
        try:
            return await discovery.list_workers()
        finally:
            await discovery.close()

    return {r.worker_id: r for r in asyncio.run(read())}


def wait_registered(etcd: EtcdServer, proc: LauncherProcess, worker_id: str) -> WorkerRecord:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        try:
            record = etcd_workers(etcd).get(worker_id)
        except DiscoveryError:  # etcd did not answer this time (a starved machine): ask again
            record = None
        if record is not None:
            return record
        if proc.proc.poll() is not None:
            raise AssertionError(f"launcher exited ({proc.proc.returncode}):\n{proc.output()[-4000:]}")
        time.sleep(1.0)
    raise AssertionError(f"{worker_id} not registered after {START_TIMEOUT}s:\n{proc.output()[-4000:]}")


def prefix_cache(url: str) -> tuple[float, float]:
    """(hits, queries) of vLLM's own prefix-cache counters, in tokens."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    hits = metrics_sum(text, ["vllm:prefix_cache_hits_total"])
    queries = metrics_sum(text, ["vllm:prefix_cache_queries_total"])
    assert hits is not None and queries is not None, "vLLM /metrics lacks the prefix-cache counters"
    return hits, queries


def long_prompt(seed: str, words: int = 300) -> str:
    """A prompt of a few hundred tokens for the tiny model's tokenizer (distinct per seed)."""
    vocab = ["kalomi", "raturu", "senovi", "peda", "the", "of", "to", "and", "zefo", "giha"]
    return seed + " " + " ".join(vocab[(i * 7 + len(seed)) % len(vocab)] for i in range(words))


class KvSubscriber:
    """A real ZMQ SUB on a worker's advertised KV endpoint, decoding with the ``vllm`` decoder."""

    def __init__(self, endpoint: str, topic: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.connect(endpoint)
        self.sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        decoder: KvEventDecoder = make_hooks().catalog().kv_decoders.get("vllm")
        self.decoder = decoder

    def stored(self, within: float) -> list[BlockStored]:
        """BlockStored events received within ``within`` seconds."""
        out: list[BlockStored] = []
        deadline = time.monotonic() + within
        while (left := deadline - time.monotonic()) > 0:
            if not self.sock.poll(int(left * 1000)):
                break
            frames = self.sock.recv_multipart()
            batch = self.decoder.decode(frames[-1])
            out += [e for e in batch.events if isinstance(e, BlockStored)]
        return out

    def close(self) -> None:
        self.sock.close(linger=0)
        self.ctx.term()
