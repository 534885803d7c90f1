"""A stand-in ``trtllm-serve serve MODEL …``: the routes of ``tensorrt_llm/serve/openai_server.py``
the adapter uses. ``GET /health``; ``GET /prometheus/metrics`` (idle gauges);
``POST /kv_cache_events``: the queued events, each call taking what it returns, as
``get_kv_cache_events_async`` does. The queue holds the JSON list in ``$TRTLLM_STANDIN_EVENTS``
only when the LLM API YAML (``--config`` / ``--extra_llm_api_options``) sets
``kv_cache_config.event_buffer_max_size`` > 0 — TRT-LLM publishes nothing otherwise.
``POST /v1/completions`` answers like a disaggregated context / generation server: with
``disaggregated_params.request_type`` ``context_only`` one token and ``choices[0].disaggregated_params``
(the ``DisaggregatedParams`` fields of ``tensorrt_llm/disaggregated_params.py``); with
``generation_only`` the completion, only when those params came back verbatim and the YAML set
``cache_transceiver_config``. ``GET /seen`` lists the bodies it received.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
from http.server import ThreadingHTTPServer

import yaml

from infera_core.testing.http_handler import QuietHandler


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
    seen: list[object] = []
    transceiver = settings.get("cache_transceiver_config")
    ctx_params = {
        "request_type": "context_only",
        "first_gen_tokens": [42],
        "ctx_request_id": 7,
        "opaque_state": None,
        "encoded_opaque_state": "b3BhcXVl",
        "draft_tokens": None,
    }

    def completion(body: dict[str, object]) -> tuple[int, object]:
        params = body.get("disaggregated_params")
        kind = params.get("request_type") if isinstance(params, dict) else None
        if kind and not transceiver:
            return 400, {"error": {"message": "disaggregated request without cache_transceiver_config"}}
        choice: dict[str, object] = {"index": 0, "text": "mixed", "finish_reason": "stop"}
        if kind == "context_only":
            choice = {"index": 0, "text": " A", "finish_reason": "length", "disaggregated_params": ctx_params}
        elif kind == "generation_only":
            want = {**ctx_params, "request_type": "generation_only"}
            if params != want:
                return 400, {"error": {"message": f"generation_only without the context's params: {params}"}}
            choice = {"index": 0, "text": " A generated", "finish_reason": "stop"}
        return 200, {
            "id": "cmpl-1",
            "object": "text_completion",
            "model": args.model,
            "choices": [choice],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        }

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            if self.path == "/health":
                return self.reply(200, "")
            if self.path == "/seen":
                with lock:
                    return self.reply(200, json.dumps(seen))
            if self.path == "/prometheus/metrics":
                metrics = "trtllm_num_requests_running 0\ntrtllm_num_requests_waiting 0\n"
                return self.reply(200, metrics, "text/plain")
            self.send_response(404)
            self.end_headers()

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            if self.path == "/v1/completions":
                body = json.loads(raw or b"{}")
                with lock:
                    seen.append(body)
                status, reply = completion(body)
                return self.reply(status, json.dumps(reply))
            if self.path != "/kv_cache_events":
                self.send_response(404)
                self.end_headers()
                return
            with lock:
                taken = list(queue)
                queue.clear()
            self.reply(200, json.dumps(taken))

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
