"""``infera-run up`` as a user runs it: comes up, answers, stops cleanly on Ctrl-C."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import IO

import httpx
import psutil
import pytest

from infera_core.testing.etcd import EtcdServer
from infera_core.testing.fleet import stopped_with_sigint
from infera_core.up.status import Snapshot

pytest.importorskip("infera_sim")

READY = re.compile(r"Infera ready: (http://127\.0\.0\.1:(\d+)/v1)\s+\((\d+) sim workers, policy (\S+)\)")


def _up(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "infera_core", "up", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _wait_ready(proc: subprocess.Popen[str], timeout: float = 90, err: _Lines | None = None) -> re.Match[str]:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        m = READY.search(line)
        if m:
            return m
    proc.kill()
    _, text = proc.communicate(timeout=10)
    text = err.text() if err is not None else text
    raise AssertionError(f"up never printed its ready line; stderr:\n{text[-3000:]}")


@pytest.fixture
def up_proc() -> Iterator[subprocess.Popen[str]]:
    proc = _up("--workers", "2", "--quiet", "--drain-timeout", "3", "--", "--speedup", "20")
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


@pytest.mark.slow
def test_up_serves_then_sigint_stops_everything(up_proc: subprocess.Popen[str]) -> None:
    m = _wait_ready(up_proc)
    url, port, workers = m.group(1), int(m.group(2)), int(m.group(3))
    assert workers == 2
    children = psutil.Process(up_proc.pid).children(recursive=True)
    assert len(children) >= 2  # one engine process per worker

    # what the printed curl line does
    r = httpx.post(
        f"{url}/chat/completions",
        json={
            "model": "sim-model",
            "messages": [{"role": "user", "content": "hello there"}],
            "max_tokens": 5,
        },
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"]
    listed = httpx.get(f"{url}/models", timeout=10).json()
    assert [m["id"] for m in listed["data"]] == ["sim-model"]
    assert len(httpx.get(f"http://127.0.0.1:{port}/v1/workers", timeout=10).json()["data"]) == 2

    up_proc.send_signal(signal.SIGINT)
    assert up_proc.wait(60) == 0
    assert up_proc.stderr is not None
    err = up_proc.stderr.read()
    assert "stopped" in err
    assert "count as lost" not in err  # an orderly stop loses no publisher's events
    _, gone_alive = psutil.wait_procs(children, timeout=10)
    assert gone_alive == [], f"left behind: {gone_alive}"
    with socket.socket() as s:  # the server's port is free again
        s.bind(("127.0.0.1", port))


@pytest.mark.slow
def test_worker_that_fails_to_start_makes_up_exit_with_its_error() -> None:
    proc = _up("--workers", "2", "--quiet", "--ready-timeout", "60", "--", "--vocab-size", "10")
    try:
        _, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    assert "--vocab-size must be at least 64" in err  # the engine's own last words
    assert "exited with code" in err
    assert "Traceback" not in err


@pytest.mark.slow
def test_unknown_engine_flag_is_one_clear_line() -> None:
    proc = _up("--workers", "1", "--quiet", "--", "--no-such-sim-flag")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "--no-such-sim-flag" in err and "Traceback" not in err


def test_busy_port_is_a_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "infera_core", "up", "--port", str(port), "--workers", "1", "--quiet"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 1
    assert f"--port {port}" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
@pytest.mark.etcd
def test_up_with_real_etcd_registers_and_cleans_up(etcd_server: EtcdServer) -> None:
    proc = _up("--workers", "2", "--quiet", "--etcd-endpoint", etcd_server.endpoint, "--", "--speedup", "20")
    with stopped_with_sigint(proc):
        url = _wait_ready(proc).group(1)
        assert len(asyncio.run(_etcd_workers(etcd_server.endpoint))) == 2
        r = httpx.post(
            f"{url}/completions",
            json={"model": "sim-model", "prompt": "one two", "max_tokens": 3},
            timeout=30,
        )
        assert r.status_code == 200, r.text
    assert asyncio.run(_etcd_workers(etcd_server.endpoint)) == []  # deregistered on the way out


async def _etcd_workers(endpoint: str) -> list[str]:
    from infera_core.discovery.base import DiscoverySettings
    from infera_core.plugin.hooks import InferaHooks

    disc = (
        InferaHooks.load()
        .require("discovery_backend", "etcd")
        .create(DiscoverySettings(etcd_endpoints=[endpoint]))
    )
    await disc.start()
    try:
        return [w.worker_id for w in await disc.list_workers()]
    finally:
        await disc.close()


@pytest.mark.slow
def test_last_engine_dying_without_restarts_stops_up_with_its_error() -> None:
    proc = _up(
        *("--workers", "1", "--quiet", "--restart-engine", "never"),
        *("--", "--speedup", "20", "--fault-crash-after", "1"),
    )
    try:
        url = _wait_ready(proc).group(1)
        body = {"model": "sim-model", "prompt": "a b c", "max_tokens": 2}
        for _ in range(2):  # the sim crashes on the request after the first
            with contextlib.suppress(httpx.HTTPError):
                httpx.post(f"{url}/completions", json=body, timeout=30)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 1
    assert "engine sim" in err and "exited with code" in err
    assert "no worker left" in err


class _Lines:
    """A subprocess's text stream read by a thread (so a full pipe never blocks the process)."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.append(line)

    def text(self) -> str:
        return "".join(self.lines)

    def wait_for(self, text: str, within: float) -> None:
        deadline = time.monotonic() + within
        while text not in self.text():
            assert time.monotonic() < deadline, f"{text!r} not seen within {within}s:\n{self.text()[-3000:]}"
            time.sleep(0.05)


def _engines(proc: subprocess.Popen[str]) -> set[int]:
    return {
        p.pid
        for p in psutil.Process(proc.pid).children()
        if any("infera_sim.server" in part for part in p.cmdline())
    }


class _Traffic:
    """Sends completions one after another from a thread; keeps every status code."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.codes: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        body = {"model": "sim-model", "prompt": "the same old question", "max_tokens": 3}
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                try:
                    self.codes.append(client.post(f"{self.url}/completions", json=body).status_code)
                except httpx.HTTPError:
                    self.codes.append(0)

    def wait_more(self, n: int, within: float = 60) -> None:
        target = len(self.codes) + n
        deadline = time.monotonic() + within
        while len(self.codes) < target:
            assert time.monotonic() < deadline, f"only {len(self.codes)} requests answered"
            time.sleep(0.02)

    def stop(self) -> list[int]:
        self._stop.set()
        self._thread.join(40)
        return self.codes


def _active_workers(port: int) -> int:
    try:
        return int(httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json().get("active_workers", 0))
    except (httpx.HTTPError, ValueError):
        return -1


def _until(predicate: Callable[[], bool], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not within {within}s"
        time.sleep(0.1)


@contextlib.contextmanager
def _serving(*args: str) -> Iterator[tuple[subprocess.Popen[str], _Lines, str, int]]:
    """``up`` ready (its stderr read by a thread), then stopped with SIGINT: it must exit 0."""
    proc = _up(*args)
    assert proc.stderr is not None
    err = _Lines(proc.stderr)
    with stopped_with_sigint(proc):
        m = _wait_ready(proc, err=err)
        yield proc, err, m.group(1), int(m.group(2))
        assert proc.poll() is None  # up never stopped on its own


@pytest.mark.slow
def test_engine_killed_with_sigkill_is_restarted_while_the_other_keeps_serving() -> None:
    with _serving("--workers", "2", "--quiet", "--drain-timeout", "2", "--", "--speedup", "20") as (
        proc,
        err,
        url,
        port,
    ):
        before = _engines(proc)
        assert len(before) == 2
        traffic = _Traffic(url)
        traffic.wait_more(5)
        os.kill(min(before), signal.SIGKILL)
        err.wait_for("restarting in", within=30)
        _until(lambda: len(_engines(proc) - before) == 1, 60, "a new engine process")
        _until(lambda: _active_workers(port) == 2, 60, "two active workers again")
        traffic.wait_more(10)
        codes = traffic.stop()
        assert codes.count(200) == len(codes), Counter(codes)


@pytest.mark.slow
def test_without_restarts_up_serves_on_with_the_remaining_worker_and_says_so() -> None:
    args = ("--workers", "2", "--quiet", "--drain-timeout", "2", "--restart-engine", "never")
    with _serving(*args, "--", "--speedup", "20") as (proc, err, url, port):
        traffic = _Traffic(url)
        traffic.wait_more(5)
        os.kill(min(_engines(proc)), signal.SIGKILL)
        err.wait_for("serving on 1 of 2 workers", within=30)
        _until(lambda: _active_workers(port) == 1, 30, "one active worker")
        traffic.wait_more(10)
        codes = traffic.stop()
        assert codes.count(200) == len(codes), Counter(codes)


def test_status_line_names_workers_that_are_down_or_restarting() -> None:
    line = Snapshot(active=3).line("kv-aware", {"serving": 3, "restarting": 1}).plain
    assert line.startswith("● workers 3 [1 restarting]")
    line = Snapshot(active=2).line("kv-aware", {"serving": 2, "failed": 1, "unhealthy": 1}).plain
    assert "1 hung (out of rotation)" in line and "1 down for good" in line
    assert "[" not in Snapshot(active=4).line("kv-aware", {"serving": 4}).plain


@pytest.mark.slow
def test_up_on_all_interfaces_without_keys_warns_once() -> None:
    """Issue #28 row 15: ``up --host 0.0.0.0`` with no keys and no admin token says, in one
    line at start, that inference is open to the network."""
    proc = _up("--host", "0.0.0.0", "--workers", "1", "--quiet", "--drain-timeout", "1")
    assert proc.stdout is not None and proc.stderr is not None
    err = _Lines(proc.stderr)
    try:
        deadline = time.monotonic() + 90
        while "Infera ready" not in (line := proc.stdout.readline()):
            assert line and time.monotonic() < deadline, err.text()[-3000:]
        err.wait_for("without --api-key-file", within=10)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    warned = [line for line in err.lines if "without --api-key-file" in line]
    assert len(warned) == 1, err.text()
    assert "0.0.0.0" in warned[0] and "anyone who can reach this port can run inference" in warned[0]
