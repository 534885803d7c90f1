"""Small networking helpers for tests and local stacks (loopback only)."""

from __future__ import annotations

import socket
import subprocess
import time
from typing import Any

WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]")
"""Host spellings that mean every interface."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now on ``host`` (any interface for a wildcard host).

    The port is bound and released at once: another process may take it before the
    caller binds it, so this suits tests, local stacks and engine launch, not a server
    that must own its port (bind port 0 and keep the socket for that).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("" if host in WILDCARD_HOSTS else host, 0))
        return int(s.getsockname()[1])


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
