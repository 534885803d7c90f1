"""``infera-run serve --processes N`` as a real subprocess for tests: a static fleet file,
started and waited for until every process answers, stopped with SIGTERM."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from infera_core.util.net import free_port, stop_process

CLOSE = {"connection": "close"}
"""A new connection per request: ``SO_REUSEPORT`` spreads connections over the processes."""


def poll(check: Callable[[], Any], within: float = 60.0) -> Any:
    """``check()`` until it returns something true (that is returned); fail after ``within`` s."""
    deadline = time.monotonic() + within
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {getattr(check, '__name__', check)}")
        time.sleep(0.05)


class ServeProcesses:
    """The running serve: ``url``, ``proc``, a client ``http`` and its processes' figures."""

    def __init__(self, url: str, proc: subprocess.Popen[str]) -> None:
        self.url = url
        self.proc = proc
        self.http = httpx.Client(base_url=url, timeout=60)
        self.processes_seen = 0
        """How many processes answered once serve was up."""

    def processes(self) -> list[dict[str, Any]]:
        """``GET /v1/admin/processes``: each process's own figures (pid, requests, in flight…)."""
        r = self.http.get("/v1/admin/processes", headers=CLOSE)
        assert r.status_code == 200, r.text
        data: list[dict[str, Any]] = r.json()["data"]
        return data

    def answered(self) -> dict[int, float]:
        """Requests each process answered."""
        return {p["process"]: p["requests"] for p in self.processes()}

    def kill(self, victim: dict[str, Any], within: float = 90.0) -> None:
        """SIGKILL the process ``victim`` (a :meth:`processes` entry); return once the
        supervisor's replacement answers in its place."""
        os.kill(victim["pid"], signal.SIGKILL)

        def replaced() -> bool:
            try:
                pids = {p["process"]: p["pid"] for p in self.processes()}
            except (httpx.HTTPError, AssertionError):
                return False
            return len(pids) == self.processes_seen and pids[victim["process"]] != victim["pid"]

        poll(replaced, within)


def start_serve(
    workers: list[dict[str, Any]],
    directory: Path,
    processes: int,
    args: Sequence[str],
    *,
    stdout: int,
    stderr: int,
) -> tuple[str, subprocess.Popen[str]]:
    """Start ``infera-run serve`` with ``processes`` processes and ``args`` over a static fleet
    file of ``workers`` written in ``directory``, on a free port: (its URL, the process). Its
    output goes to ``stdout`` and ``stderr`` (``subprocess`` constants); the caller stops it."""
    fleet = directory / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"workers": workers}))
    port = free_port()
    infera_run = str(Path(sys.executable).with_name("infera-run"))
    argv = [infera_run, "serve", "--port", str(port), "--processes", str(processes), "--discovery", "static"]
    proc = subprocess.Popen(
        [*argv, "--static-file", str(fleet), *args],
        stdout=stdout,
        stderr=stderr,
        text=True,
        env=dict(os.environ, INFERA_LOG_LEVEL="warning"),
    )
    return f"http://127.0.0.1:{port}", proc


@contextlib.contextmanager
def serve_processes(
    workers: list[dict[str, Any]], directory: Path, *args: str, processes: int = 2
) -> Iterator[ServeProcesses]:
    """Serve ``workers`` (static fleet records) with ``processes`` processes and ``args``."""
    url, proc = start_serve(
        workers, directory, processes, args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    serve = ServeProcesses(url, proc)
    try:

        def serving() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"serve exited: {proc.stdout.read() if proc.stdout else ''}")
            try:
                if processes == 1:  # no supervisor, no /v1/admin/processes: up once it knows its workers
                    serve.processes_seen = int(serve.http.get("/health", headers=CLOSE).status_code == 200)
                else:
                    serve.processes_seen = len(serve.processes())
            except (httpx.HTTPError, AssertionError):
                return False
            return serve.processes_seen == processes

        poll(serving)
        yield serve
    finally:
        serve.http.close()
        stop_process(proc, grace=30)
