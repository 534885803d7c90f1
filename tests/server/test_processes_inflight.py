"""``--max-inflight-per-worker`` under ``infera-run serve --processes 2`` is the router's cap.

Real processes (the supervisor and its two forks), real HTTP on 127.0.0.1 with a new
connection per request (``SO_REUSEPORT`` spreads them over the processes) and a worker
that holds its requests until the test lets them go. With a cap of 1 and one request
held, every other request gets 429 from both processes (each process counting only its
own would let the other one's through); a SIGKILLed process's request stops counting
once it is restarted."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from infera_core.testing.serve_processes import CLOSE, ServeProcesses, serve_processes
from infera_core.testing.serve_processes import poll as _until

MODEL = "m"
ANSWER = json.dumps(
    {"id": "c", "object": "text_completion", "model": MODEL, "choices": [{"index": 0, "text": "ok"}]}
).encode()


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
    def __init__(self, serve: ServeProcesses, worker: HoldingWorker) -> None:
        self.serve = serve
        self.worker = worker
        self.pool = ThreadPoolExecutor(4)

    def complete(self) -> httpx.Response:
        body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
        return self.serve.http.post("/v1/completions", json=body, headers=CLOSE)

    def hold_one(self) -> Future[httpx.Response]:
        """A request the worker holds (it has arrived there when this returns)."""
        before = self.worker.arrived
        held = self.pool.submit(self.complete)
        _until(lambda: self.worker.arrived == before + 1 or held.done())
        assert not held.done(), held.result().text
        return held

    def refused_by_both(self) -> list[httpx.Response]:
        """Requests until both processes answered some; every one must be refused."""
        before = self.serve.answered()
        out: list[httpx.Response] = []
        while True:
            out.append(self.complete())
            assert out[-1].status_code == 429, (out[-1].status_code, out[-1].text, self.worker.arrived)
            now = self.serve.answered()
            if all(now[p] > before[p] for p in before):
                return out
            assert len(out) < 200, (before, now)


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    worker = HoldingWorker()
    threading.Thread(target=worker.serve_forever, daemon=True).start()
    # --queue-max 0: refused at once (the router queue has its own tests, test_queue_live.py)
    args = ("--router-policy", "round-robin", "--max-inflight-per-worker", "1", "--queue-max", "0")
    try:
        with serve_processes(
            [{"worker_id": "w0", "url": worker.url, "model": MODEL}],
            tmp_path_factory.mktemp("inflight"),
            *args,
        ) as serve:
            r = Router(serve, worker)
            worker.gate.set()
            _until(lambda: r.complete().status_code == 200)
            worker.gate.clear()
            try:
                yield r
            finally:
                worker.gate.set()
                r.pool.shutdown(wait=True)
    finally:
        worker.gate.set()
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
    before = router.serve.answered()
    while True:
        assert router.complete().status_code == 200
        now = router.serve.answered()
        if all(now[p] > before[p] for p in before):
            break
    router.worker.gate.clear()


def test_a_killed_process_does_not_keep_its_requests_counted(router: Router) -> None:
    router.worker.gate.clear()
    held = router.hold_one()
    (holder,) = [p for p in router.serve.processes() if p["in_flight"] == 1]
    router.serve.kill(holder)
    with pytest.raises(httpx.HTTPError):
        held.result(60)  # its connection died with the process
    # the dead process's count was cleared by its successor: one request is admitted again
    # (whichever process takes it), and the cap holds for the rest
    again = router.hold_one()
    router.refused_by_both()
    router.worker.gate.set()
    assert again.result(60).status_code == 200
