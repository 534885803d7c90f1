"""A stand-in ``trtllm-serve serve MODEL …``: the routes of ``tensorrt_llm/serve/openai_server.py``
the adapter uses. ``GET /health``; ``GET /prometheus/metrics`` (idle gauges);
``POST /kv_cache_events``: the queued events, each call taking what it returns, as
``get_kv_cache_events_async`` does. The queue holds the JSON list in ``$TRTLLM_STANDIN_EVENTS``
only when the LLM API YAML (``--config`` / ``--extra_llm_api_options``) sets
``kv_cache_config.event_buffer_max_size`` > 0 — TRT-LLM publishes nothing otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml


def main() -> None:
    p = argparse.ArgumentParser(prog="trtllm-serve")
    p.add_argument("command", choices=["serve"])
    p.add_argument("model")
    p.add_argument("--host", default="localhost")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--tp_size", type=int, default=1)
    p.add_argument("--pp_size", type=int, default=1)
    p.add_argument("--config", "--extra_llm_api_options", dest="config")
    args, _ = p.parse_known_args()
    settings = {}
    if args.config:
        with open(args.config, encoding="utf-8") as f:
            settings = yaml.safe_load(f) or {}
    buffer = int((settings.get("kv_cache_config") or {}).get("event_buffer_max_size") or 0)
    queue: list[object] = []
    if buffer > 0 and os.environ.get("TRTLLM_STANDIN_EVENTS"):
        with open(os.environ["TRTLLM_STANDIN_EVENTS"], encoding="utf-8") as f:
            queue = json.load(f)
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *a: object) -> None:
            pass

        def _send(self, body: str, ctype: str = "application/json") -> None:
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                return self._send("")
            if self.path == "/prometheus/metrics":
                return self._send(
                    "trtllm_num_requests_running 0\ntrtllm_num_requests_waiting 0\n", "text/plain"
                )
            self.send_response(404)
            self.end_headers()

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            if self.path != "/kv_cache_events":
                self.send_response(404)
                self.end_headers()
                return
            with lock:
                taken = list(queue)
                queue.clear()
            self._send(json.dumps(taken))

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
