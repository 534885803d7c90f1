"""Small networking helpers for tests and local stacks (loopback only)."""

from __future__ import annotations

import socket
import subprocess
import time
from typing import Any

from infera_core.util.net import free_port as free_port  # the one implementation, re-exported


def wait_port(host: str, port: int, timeout: float = 10.0) -> None:
    """Wait until something accepts TCP connections on ``host:port``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listening on {host}:{port} after {timeout}s") from None
            time.sleep(0.02)


def stop_process(proc: subprocess.Popen[Any] | None, grace: float = 5.0) -> None:
    """SIGTERM ``proc`` (if it still runs), SIGKILL it after ``grace`` seconds, and reap it."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
