"""``--max-inflight-per-worker`` under ``infera-run serve --processes 2`` is the router's cap.

Real processes (the supervisor and its two forks), real HTTP on 127.0.0.1 with a new
connection per request (``SO_REUSEPORT`` spreads them over the processes) and a worker
that holds its requests until the test lets them go. With a cap of 1 and one request
held, every other request gets 429 from both processes (each process counting only its
own would let the other one's through); a SIGKILLed process's request stops counting
once it is restarted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from infera_core.testing.net import free_port

MODEL = "m"
INFERA_RUN = str(Path(sys.executable).with_name("infera-run"))
CLOSE = {"connection": "close"}
ANSWER = json.dumps(
    {"id": "c", "object": "text_completion", "model": MODEL, "choices": [{"index": 0, "text": "ok"}]}
).encode()


def _until(check: Callable[[], Any], within: float = 60.0) -> Any:
    deadline = time.monotonic() + within
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {getattr(check, '__name__', check)}")
        time.sleep(0.05)


class HoldingWorker(ThreadingHTTPServer):
    """Answers completions once ``gate`` is open; counts the requests that arrived."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.gate = threading.Event()
        self.arrived = 0
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: HoldingWorker

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # health and metrics probes: nothing to report
        self.send_response(404)
        self.send_header("content-length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        with self.server.lock:
            self.server.arrived += 1
        if not self.server.gate.wait(60):
            return
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(ANSWER)))
        self.end_headers()
        self.wfile.write(ANSWER)


class Router:
    def __init__(self, url: str, proc: subprocess.Popen[str], worker: HoldingWorker) -> None:
        self.url = url
        self.proc = proc
        self.worker = worker
        self.http = httpx.Client(base_url=url, timeout=60)
        self.pool = ThreadPoolExecutor(4)

    def complete(self) -> httpx.Response:
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
        return self.http.post("/v1/completions", json=body, headers=CLOSE)

    def hold_one(self) -> Future[httpx.Response]:
        """A request the worker holds (it has arrived there when this returns)."""
        before = self.worker.arrived
        held = self.pool.submit(self.complete)
        _until(lambda: self.worker.arrived == before + 1 or held.done())
        assert not held.done(), held.result().text
        return held

    def processes(self) -> list[dict[str, Any]]:
        r = self.http.get("/v1/admin/processes", headers=CLOSE)
        assert r.status_code == 200, r.text
        data: list[dict[str, Any]] = r.json()["data"]
        return data

    def answered(self) -> dict[int, float]:
        return {p["process"]: p["requests"] for p in self.processes()}

    def refused_by_both(self) -> list[httpx.Response]:
        """Requests until both processes answered some; every one must be refused."""
        before = self.answered()
        out: list[httpx.Response] = []
        while True:
            out.append(self.complete())
            assert out[-1].status_code == 429, (out[-1].status_code, out[-1].text, self.worker.arrived)
            now = self.answered()
            if all(now[p] > before[p] for p in before):
                return out
            assert len(out) < 200, (before, now)


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    tmp = tmp_path_factory.mktemp("inflight")
    worker = HoldingWorker()
    threading.Thread(target=worker.serve_forever, daemon=True).start()
    fleet = tmp / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"workers": [{"worker_id": "w0", "url": worker.url, "model": MODEL}]}))
    port = free_port()
    argv = [INFERA_RUN, "serve", "--port", str(port), "--processes", "2", "--discovery", "static"]
    argv += ["--static-file", str(fleet), "--router-policy", "round-robin", "--max-inflight-per-worker", "1"]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, INFERA_LOG_LEVEL="warning"),
    )
    r = Router(f"http://127.0.0.1:{port}", proc, worker)
    try:

        def serving() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"serve exited: {proc.stdout.read() if proc.stdout else ''}")
            try:
                return len(r.processes()) == 2
            except (httpx.HTTPError, AssertionError):
                return False

        _until(serving)
        worker.gate.set()
        _until(lambda: r.complete().status_code == 200)
        worker.gate.clear()
        yield r
    finally:
        worker.gate.set()
        r.http.close()
        r.pool.shutdown(wait=True)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        worker.shutdown()
        worker.server_close()


def test_one_request_in_flight_fills_the_cap_for_both_processes(router: Router) -> None:
    held = router.hold_one()
    refused = router.refused_by_both()
    arrived = router.worker.arrived
    assert all(r.headers.get("retry-after") for r in refused)
    router.worker.gate.set()
    assert held.result(60).status_code == 200
    assert router.worker.arrived == arrived  # nothing refused reached the worker
    # the request done, either process admits again
    before = router.answered()
    while True:
        assert router.complete().status_code == 200
        now = router.answered()
        if all(now[p] > before[p] for p in before):
            break
    router.worker.gate.clear()


def test_a_killed_process_does_not_keep_its_requests_counted(router: Router) -> None:
    router.worker.gate.clear()
    held = router.hold_one()
    (holder,) = [p for p in router.processes() if p["in_flight"] == 1]
    os.kill(holder["pid"], signal.SIGKILL)
    with pytest.raises(httpx.HTTPError):
        held.result(60)  # its connection died with the process

    def restarted() -> bool:
        try:
            pids = {p["process"]: p["pid"] for p in router.processes()}
        except (httpx.HTTPError, AssertionError):
            return False
        return len(pids) == 2 and pids[holder["process"]] != holder["pid"]

    _until(restarted)
    # the dead process's count was cleared by its successor: one request is admitted again
    # (whichever process takes it), and the cap holds for the rest
    again = router.hold_one()
    router.refused_by_both()
    router.worker.gate.set()
    assert again.result(60).status_code == 200
