"""A tiny stand-in engine for launcher tests: an HTTP server on loopback.

``python -m infera_core.testing.standin_engine --port P [--delay S] [--die-after S]
[--fail-health] [--fail-health-after S]`` serves:

* ``GET /health`` — 200 (503 with ``--fail-health``, or once ``--fail-health-after`` passed);
* ``GET /metrics`` — ``vllm:num_requests_running`` = requests being served right now;
* ``POST /v1/completions`` — waits ``--delay`` seconds, then answers an OpenAI-shaped
  completion (``max_tokens`` words).

``--die-after S`` exits with code 3 after S seconds (a crashing engine). SIGTERM stops it
with exit code 0. Only the standard library is imported, so it starts fast.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from typing import Any

from infera_core.testing.http_handler import QuietHandler

DIE_EXIT_CODE = 3


class _State:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self.running = 0
        self.served = 0

    def healthy(self) -> bool:
        if self.args.fail_health:
            return False
        after = self.args.fail_health_after
        return after is None or time.monotonic() - self.started < after


def _handler(state: _State) -> type[QuietHandler]:
    class Handler(QuietHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            print(f"{self.command} {self.path} {args[1] if len(args) > 1 else ''}", flush=True)

        def do_GET(self) -> None:
            if self.path == "/health":
                ok = state.healthy()
                self.reply(200 if ok else 503, b"{}" if ok else b'{"error": "unhealthy"}')
            elif self.path == "/metrics":
                with state.lock:
                    text = (
                        "# TYPE vllm:num_requests_running gauge\n"
                        f'vllm:num_requests_running{{model_name="standin"}} {float(state.running)}\n'
                        f"standin_requests_served_total {float(state.served)}\n"
                    )
                self.reply(200, text.encode(), "text/plain; version=0.0.4")
            else:
                self.reply(404, b'{"error": "not found"}')

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b"{}"
            if self.path != "/v1/completions":
                self.reply(404, b'{"error": "not found"}')
                return
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                self.reply(400, b'{"error": {"message": "invalid JSON", "type": "invalid_request_error"}}')
                return
            with state.lock:
                state.running += 1
            try:
                time.sleep(state.args.delay)
                n = int(body.get("max_tokens") or 4)
                out = {
                    "id": f"cmpl-standin-{state.served}",
                    "object": "text_completion",
                    "created": int(time.time()),
                    "model": body.get("model", "standin"),
                    "choices": [{"index": 0, "text": " ok" * n, "finish_reason": "length", "logprobs": None}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1},
                }
                self.reply(200, json.dumps(out).encode())
            finally:
                with state.lock:
                    state.running -= 1
                    state.served += 1

    return Handler


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="standin_engine", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds each completion takes")
    parser.add_argument("--die-after", type=float, default=None, help="exit with code 3 after S seconds")
    parser.add_argument("--fail-health", action="store_true", help="/health always answers 503")
    parser.add_argument("--fail-health-after", type=float, default=None, help="/health 503 after S seconds")
    parser.add_argument("--startup-delay", type=float, default=0.0, help="seconds before listening")
    args = parser.parse_args(argv)
    state = _State(args)
    time.sleep(args.startup_delay)
    server = ThreadingHTTPServer((args.host, args.port), _handler(state))
    server.daemon_threads = True

    def on_term(signum: int, frame: object) -> None:
        print("standin engine: SIGTERM, bye", flush=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    if args.die_after is not None:

        def die() -> None:
            print(f"standin engine: crashing on purpose after {args.die_after}s", flush=True)
            os._exit(DIE_EXIT_CODE)

        threading.Timer(args.die_after, die).start()
    print(f"standin engine listening on http://{args.host}:{args.port}", flush=True)
    try:
        server.serve_forever(poll_interval=0.1)
    finally:
        sys.stdout.flush()


if __name__ == "__main__":
    main()
