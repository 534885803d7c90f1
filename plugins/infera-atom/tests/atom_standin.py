"""A stand-in ATOM OpenAI server: ``GET /health`` and ``GET /metrics`` in ATOM's exposition.

The gauges are the ones ATOM's exporter renders (``atom/entrypoints/openai/metrics.py``:
``atom:requests_running`` / ``atom:requests_waiting`` / ``atom:requests_parked_kv_load``,
unlabelled, summed across DP ranks, plus ``atom:metrics_snapshot_available``). The engine
starts with ``--busy N`` requests in flight; each ``/metrics`` scrape finishes one of them, so a
drain that reads the gauges sees N, N-1, …, 0. ``GET /scrapes`` says how many scrapes it served.

Run: ``python atom_standin.py --host 127.0.0.1 --port P --busy 2``.
"""

from __future__ import annotations

import argparse
import threading
from http.server import ThreadingHTTPServer

from infera_core.testing.http_handler import QuietHandler

HELP = {
    "atom:metrics_snapshot_available": "Whether an engine snapshot is available.",
    "atom:requests_running": "Number of requests currently running across data-parallel ranks.",
    "atom:requests_waiting": "Number of requests waiting across data-parallel ranks.",
    "atom:requests_parked_kv_load": "Number of requests parked for an external KV load.",
}


def exposition(running: int, waiting: int, parked: int) -> str:
    values = {
        "atom:metrics_snapshot_available": 1,
        "atom:requests_running": running,
        "atom:requests_waiting": waiting,
        "atom:requests_parked_kv_load": parked,
    }
    lines = []
    for name, value in values.items():
        lines += [f"# HELP {name} {HELP[name]}", f"# TYPE {name} gauge", f"{name} {float(value)}"]
    return "\n".join(lines) + "\n"


PROMETHEUS = "text/plain; version=0.0.4"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--busy", type=int, default=0)
    args = p.parse_args()
    lock = threading.Lock()
    state = {"busy": args.busy, "scrapes": 0}

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            if self.path == "/health":
                return self.reply(200, "", PROMETHEUS)
            if self.path == "/scrapes":
                with lock:
                    return self.reply(200, str(state["scrapes"]), PROMETHEUS)
            if self.path == "/metrics":
                with lock:
                    busy = state["busy"]
                    state["scrapes"] += 1
                    state["busy"] = max(0, busy - 1)
                # one running, the rest waiting (one of those parked for its KV)
                running = min(busy, 1)
                parked = 1 if busy > 2 else 0
                return self.reply(200, exposition(running, busy - running - parked, parked), PROMETHEUS)
            self.send_response(404)
            self.end_headers()

        def do_POST(self) -> None:
            # an engine's API: an empty completion request is a validation error, nothing runs
            self.rfile.read(int(self.headers.get("content-length") or 0))
            if self.path == "/v1/completions":
                return self.reply(400, '{"error": {"message": "model is required"}}', "application/json")
            self.send_response(404)
            self.end_headers()

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
