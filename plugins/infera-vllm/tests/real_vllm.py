"""Helpers for the real-vLLM tests: the venv built by ``.ci/steps/20-vllm-venv.sh``, launcher
subprocesses running real vLLM, a router in front of them and ``/metrics`` parsing (etcd reads and
KV event subscription: :mod:`infera_core.testing.published`)."""

from __future__ import annotations

import contextlib
import json
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

from infera_core.engines.support import metrics_sum
from infera_core.testing.engine_env import clean_environ
from infera_core.testing.etcd import EtcdServer
from infera_core.testing.fleet import LauncherProcess
from infera_core.util.net import free_port, stop_process, wait_port

REPO = Path(__file__).resolve().parents[3]
VENV = REPO / ".venv-vllm"
ENGINE_ARGS = ["--max-model-len", "2048", "--enforce-eager", "--kv-cache-memory-bytes", "67108864"]
BLOCK = 32


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


def vllm_check(script: str, argvs: list[list[str]], timeout: float) -> list[dict[str, Any]]:
    """Run ``script`` (a ``vllm_*_check.py`` beside this module) under the real vLLM venv on
    ``argvs``: its JSON list of results, one per argv (a visible skip without the venv)."""
    python, _ = vllm_python()
    done = subprocess.run(
        [python, str(Path(__file__).resolve().parent / script)],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return results


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
    """``vllm_worker("w1")`` → ``infera-run worker vllm`` running real vLLM, registered in etcd
    (``engine_args=(…)``: more vLLM flags after ``ENGINE_ARGS``)."""
    python, model = vllm_python()
    started: list[LauncherProcess] = []

    def launch(worker_id: str, *extra: str, engine_args: tuple[str, ...] = ()) -> LauncherProcess:
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
            *engine_args,
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
        stop_process(self.proc, grace=10)
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


@contextlib.contextmanager
def vllm_server(
    tmp: Path, *extra: str, env: dict[str, str] | None = None, model: Path | None = None
) -> Iterator[str]:
    """Real vLLM (``vllm.entrypoints.openai.api_server``) serving the tiny model (or ``model``) as
    ``tiny`` on a free port until the block exits; yields its URL (``tmp``: its log and cache)."""
    python, tiny = vllm_python()
    port = free_port()
    logs = tmp / "vllm.log"
    argv = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model or tiny),
        "--served-model-name",
        "tiny",
    ]
    argv += ["--host", "127.0.0.1", "--port", str(port), *ENGINE_ARGS, *extra]
    with logs.open("wb") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**engine_env(tmp / "cache"), **(env or {})},
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM exited ({proc.returncode}) before serving:\n{logs.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM did not serve within 600 s:\n{logs.read_text()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def running_up(args: list[str], env: dict[str, str]) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """``infera-run up <args>`` (two vLLM workers) on a free port, quiet, with room for engines that
    start in ~20 s on an idle laptop but minutes on a loaded 2-core CI machine: (its OpenAI base URL,
    the process, its ready line read). Stopped with SIGINT on leaving; it must have exited 0."""
    harness = ["--port", "0", "--quiet", "--ready-timeout", "600"]
    cmd = [sys.executable, "-m", "infera_core", "up", *harness, *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline()  # bounded by the test's timeout; EOF if up failed
        m = re.match(r"Infera ready: (http://127\.0\.0\.1:\d+/v1)\s+\(2 vllm workers", ready)
        if m is None:
            proc.wait(60)  # up said why on stderr before it exited
            raise AssertionError(
                f"no ready line: {ready!r}; stderr:\n{proc.stderr.read() if proc.stderr else ''}"
            )
        yield m.group(1), proc
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()  # up's engines die with it (their parent-death signal)
            proc.wait(30)
    assert proc.returncode == 0
