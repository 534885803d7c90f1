"""What hostile request bodies cost the router: /health latency and router RSS under load.

Starts ``infera-run serve`` (memory discovery, no workers: the body's cost is all the
router's) and sends ``--concurrent`` bodies of ``--objects`` tiny message objects at once
(default 3 × 2.5 M objects, ~32 MB each, ``curl`` processes, so the client is not this
process), while one keep-alive client polls ``GET /health`` every 10 ms. Reports the
answers, /health latency (p50 / max) and the router's peak RSS (``VmHWM``).

    .venv/bin/python -m bench.router.hostile_bodies [--objects 2500000] [--concurrent 3] [--shape tiny|text]
        [-- serve flags…]

Run it with ``PYTHONPATH`` at an older checkout to compare before/after.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from infera_core.util.net import free_port


def _rss_peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _wait_up(port: int, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
        try:
            conn.request("GET", "/health")
            conn.getresponse().read()
            return
        except OSError:
            time.sleep(0.1)
        finally:
            conn.close()
    raise SystemExit("the router did not start")


def body_of(shape: str, objects: int) -> bytes:
    """``tiny``: ``objects`` tiny message objects; ``text``: one message whose content is a
    string as long as that body would be (a large body the router accepts and parses)."""
    if shape == "text":
        return b'{"model":"nope","messages":[{"role":"user","content":"' + b"a" * (13 * objects) + b'"}]}'
    return b'{"model":"nope","messages":[' + b",".join([b'{"role":"u"}'] * objects) + b"]}"


def measure(
    objects: int, concurrent: int, serve_args: list[str], shape: str = "tiny"
) -> dict[str, float | list[str]]:
    port = free_port()
    body = body_of(shape, objects)
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        f.write(body)
        f.flush()
        router = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from infera_core.cli import main; main()",
                "serve",
                "--discovery",
                "memory",
                "--port",
                str(port),
                *serve_args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_up(port)
            rss_before = _rss_mb(router.pid)
            latencies: list[tuple[float, float]] = []
            stop = threading.Event()

            def poll() -> None:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                with contextlib.closing(conn):
                    while not stop.is_set():
                        t0 = time.perf_counter()
                        conn.request("GET", "/health")
                        conn.getresponse().read()
                        latencies.append((t0, time.perf_counter() - t0))
                        time.sleep(0.01)

            poller = threading.Thread(target=poll, daemon=True)
            poller.start()
            time.sleep(0.3)
            t0 = time.perf_counter()
            curls = [
                subprocess.Popen(
                    [
                        "curl",
                        "-s",
                        "-o",
                        "/dev/null",
                        "-w",
                        "%{http_code}",
                        "-H",
                        "content-type: application/json",
                        "--data-binary",
                        f"@{f.name}",
                        f"http://127.0.0.1:{port}/v1/chat/completions",
                    ],
                    stdout=subprocess.PIPE,
                    text=True,
                )
                for _ in range(concurrent)
            ]
            codes = [c.communicate(timeout=300)[0] for c in curls]
            elapsed = time.perf_counter() - t0
            time.sleep(0.3)
            stop.set()
            poller.join(30)
            during = sorted(dt for at, dt in latencies if at >= t0)
            return {
                "body_mb": len(body) / 1e6,
                "answers": codes,
                "seconds": elapsed,
                "health_p50_ms": during[len(during) // 2] * 1000,
                "health_max_ms": during[-1] * 1000,
                "health_polls": float(len(during)),
                "rss_before_mb": rss_before,
                "rss_peak_mb": _rss_peak_mb(router.pid),
            }
        finally:
            router.terminate()
            router.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=2_500_000)
    parser.add_argument("--concurrent", type=int, default=3)
    parser.add_argument("--shape", choices=["tiny", "text"], default="tiny", help="see body_of()")
    args, serve_args = parser.parse_known_args()
    serve_args = [a for a in serve_args if a != "--"]
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    for concurrent in sorted({1, args.concurrent}):
        out = measure(args.objects, concurrent, serve_args, args.shape)
        print(
            f"{concurrent} × {out['body_mb']:.1f} MB: "
            + ", ".join(
                f"{k} {v}" if isinstance(v, list) else f"{k} {v:.1f}"
                for k, v in out.items()
                if k != "body_mb"
            )
        )


if __name__ == "__main__":
    main()
