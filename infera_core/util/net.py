"""Small networking helpers for tests and local stacks (loopback only)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from typing import IO, Any

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


def stop_process(proc: subprocess.Popen[Any] | None, grace: float = 5.0, sig: int = signal.SIGTERM) -> None:
    """Send ``sig`` to ``proc`` (if it still runs), SIGKILL it after ``grace`` seconds, and reap it."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stop_groups(procs: list[subprocess.Popen[Any]], grace: float = 5.0, sig: int = signal.SIGTERM) -> None:
    """Send ``sig`` to the process group of each of ``procs`` (started with
    ``start_new_session=True``), then wait up to ``grace`` seconds for each; the groups whose
    leader has not exited by then are SIGKILLed. Every leader is reaped."""
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
    for proc in procs:
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class LoopbackServer:
    """A server process for tests and local stacks: a working folder (a temp one unless
    given) that survives restarts, the process's output appended to a log file there, and
    ``stop`` / ``restart`` / ``close``. A subclass says how to start it in :meth:`start`
    (build its command line and call :meth:`spawn`)."""

    log_name = "server.log"

    def __init__(self, binary: str, work_dir: str | None, prefix: str) -> None:
        self.binary = binary
        self._tmp = None if work_dir else tempfile.TemporaryDirectory(prefix=prefix)
        self.work_dir = work_dir or (self._tmp.name if self._tmp else "")
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self, timeout: float = 10.0) -> None:
        raise NotImplementedError

    def spawn(self, argv: list[str]) -> None:
        """Start ``argv`` with its output appended to :attr:`log_name` in the working folder."""
        self._log = open(os.path.join(self.work_dir, self.log_name), "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        stop_process(self.proc)
        self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
