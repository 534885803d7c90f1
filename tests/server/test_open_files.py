"""The open-file limit (issue #28 row 10): ``infera-run serve`` raises its soft
``RLIMIT_NOFILE`` to the hard one, caps ``--max-connections`` to what the limit holds with
one warning, and a client past the cap gets a 503 and a log line, never a silent drop."""

from __future__ import annotations

import contextlib
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from infera_core.server.fds import RESERVE, connections_that_fit
from infera_core.testing.fleet import stop_process
from infera_core.util.net import free_port

INFERA_RUN = str(Path(sys.executable).with_name("infera-run"))
_, HARD = resource.getrlimit(resource.RLIMIT_NOFILE)


@contextlib.contextmanager
def serve_limited(
    tmp: Path, soft: int, hard: int, *args: str
) -> Iterator[tuple[subprocess.Popen[str], str, Path]]:
    """``infera-run serve`` started with the open-file limits (soft, hard); its output in a file."""
    port = free_port()
    log = tmp / "serve.log"

    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    fleet = tmp / "fleet.yaml"
    fleet.write_text("workers: []\n")
    argv = [INFERA_RUN, "serve", "--port", str(port), "--processes", "1", "--discovery", "static"]
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*argv, "--static-file", str(fleet), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=limits,  # setrlimit only, before the exec
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                httpx.get(url + "/health", timeout=1)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
        yield proc, url, log
    finally:
        stop_process(proc)


def _soft_limit(pid: int) -> tuple[int, int]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no open-file limit in /proc")


def test_the_connection_cap_fits_the_descriptors() -> None:
    assert connections_that_fit(8192, 4096, 1 << 20) == 8192
    assert connections_that_fit(8192, 4096, 1024) == (1024 - RESERVE) // 2
    assert connections_that_fit(8192, 100, 1024) == 1024 - RESERVE - 100
    assert connections_that_fit(10, 4096, 1024) == 10


@pytest.mark.slow
@pytest.mark.skipif(HARD < 16384 or HARD == resource.RLIM_INFINITY, reason="needs a hard limit >= 16384")
def test_the_soft_limit_is_raised_to_the_hard_one(tmp_path: Path) -> None:
    """systemd's soft 1024 with the default --max-connections 8192: raised, nothing capped."""
    with serve_limited(tmp_path, 1024, HARD) as (proc, _, log):
        assert _soft_limit(proc.pid) == (HARD, HARD)
        assert "does not fit the open-file limit" not in log.read_text()


@pytest.mark.slow
def test_a_limit_too_small_caps_max_connections_with_one_warning_and_503s_past_it(tmp_path: Path) -> None:
    cap = (300 - RESERVE) // 2
    with serve_limited(tmp_path, 300, 300, "--max-connections-per-client", "8192") as (_, url, log):
        warned = [line for line in log.read_text().splitlines() if "does not fit the open-file limit" in line]
        assert len(warned) == 1 and f"capped to {cap}" in warned[0], log.read_text()
        host, port = url.removeprefix("http://").split(":")
        held = [socket.create_connection((host, int(port))) for _ in range(cap)]
        try:
            with socket.create_connection((host, int(port))) as extra:
                extra.settimeout(10)
                answer = extra.recv(4096)
            assert answer.startswith(b"HTTP/1.1 503") and b"too_many_connections" in answer
        finally:
            for s in held:
                s.close()
        deadline = time.monotonic() + 10
        while "refusing a connection" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
