"""Start real sim engine processes in tests.

    from infera_sim.testing import start_sim

    with start_sim(speedup="inf", cache_blocks=64) as sim:
        httpx.post(sim.url + "/v1/completions", json={...})

Flags are the server's flags with ``_`` for ``-`` (``cache_blocks=64`` → ``--cache-blocks 64``;
``True`` → a bare flag). KV events and replay are on (free ports) unless
``kv_events_port=None`` is passed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any

import httpx

READY = "INFERA_SIM_READY "


@dataclass
class SimHandle:
    """A running sim process."""

    url: str
    port: int
    kv_events_endpoint: str | None
    replay_endpoint: str | None
    proc: subprocess.Popen[str]
    info: dict[str, Any] = field(default_factory=dict)
    output: list[str] = field(default_factory=list)
    """Lines the process printed (stdout and stderr), for debugging failures."""

    @property
    def bootstrap_port(self) -> int | None:
        port = self.info.get("bootstrap_port")
        return int(port) if port is not None else None

    def stop(self, timeout: float = 5.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)


def sim_argv(port: int | None = None, **flags: Any) -> list[str]:
    """The command line of a sim with these flags."""
    argv = [sys.executable, "-m", "infera_sim.server", "--port", str(port or 0)]
    for name, value in flags.items():
        if value is None or value is False:
            continue
        flag = "--" + name.replace("_", "-")
        argv += [flag] if value is True else [flag, str(value)]
    return argv


def _pump(stream: IO[str], sink: list[str], ready: list[dict[str, Any]], event: threading.Event) -> None:
    for line in stream:
        sink.append(line.rstrip("\n"))
        if line.startswith(READY):
            ready.append(json.loads(line[len(READY) :]))
            event.set()
    event.set()


@contextmanager
def start_sim(
    port: int | None = None, timeout: float = 20.0, wait_healthy: bool = True, **flags: Any
) -> Iterator[SimHandle]:
    """Run ``python -m infera_sim.server`` until the block exits; waits for ``/health``."""
    flags.setdefault("kv_events_port", 0)
    flags.setdefault("kv_replay_port", 0)
    flags.setdefault("host", "127.0.0.1")
    argv = sim_argv(port, **flags)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    output: list[str] = []
    ready: list[dict[str, Any]] = []
    event = threading.Event()
    threading.Thread(target=_pump, args=(proc.stdout, output, ready, event), daemon=True).start()
    try:
        if not event.wait(timeout) or not ready:
            raise RuntimeError("sim did not start:\n" + "\n".join(output[-30:]))
        info = ready[0]
        host = "127.0.0.1"
        handle = SimHandle(
            url=f"http://{host}:{info['port']}",
            port=int(info["port"]),
            kv_events_endpoint=f"tcp://{host}:{info['kv_events_port']}"
            if info.get("kv_events_port")
            else None,
            replay_endpoint=f"tcp://{host}:{info['kv_replay_port']}" if info.get("kv_replay_port") else None,
            proc=proc,
            info=info,
            output=output,
        )
        if wait_healthy:
            _wait_health(handle, timeout)
        yield handle
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def _wait_health(handle: SimHandle, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if handle.proc.poll() is not None:
            raise RuntimeError("sim exited:\n" + "\n".join(handle.output[-30:]))
        try:
            if httpx.get(handle.url + "/health", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.02)
    raise TimeoutError(f"sim at {handle.url} not healthy after {timeout}s")
