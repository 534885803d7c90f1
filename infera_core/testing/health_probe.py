"""``/health`` latency measured from a process of its own: ``python -m
infera_core.testing.health_probe URL`` asks ``URL/health`` over one keep-alive connection
every ``--every`` seconds until its stdin closes, then prints one JSON line: the number of
checks, the worst and the median latency (seconds).

A probe in the attacking process would measure that process too: sending a 31 MB body
through an HTTP client holds its interpreter for tens of milliseconds at a time.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import threading
import time
from urllib.parse import urlsplit


def _get(sock: socket.socket, host: str) -> None:
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: %s\r\n\r\n" % host.encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (
            int(v)
            for k, _, v in (h.partition(b":") for h in head.split(b"\r\n"))
            if k.lower() == b"content-length"
        ),
        0,
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        body += chunk


def probe(url: str, every: float, stop: threading.Event) -> list[float]:
    """Latencies of ``GET /health`` until ``stop`` is set (a new connection after a failure)."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    times: list[float] = []
    sock: socket.socket | None = None
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            if sock is None:
                sock = socket.create_connection((host, port), timeout=60)
            _get(sock, host)
        except OSError:
            if sock is not None:
                sock.close()
            sock = None
            continue
        times.append(time.monotonic() - t0)
        stop.wait(every)
    if sock is not None:
        sock.close()
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("url")
    p.add_argument("--every", type=float, default=0.02)
    a = p.parse_args(argv)
    stop = threading.Event()
    out: list[float] = []
    t = threading.Thread(target=lambda: out.extend(probe(a.url, a.every, stop)), daemon=True)
    t.start()
    sys.stdin.read()  # until the parent closes it
    stop.set()
    t.join(120)
    result = {
        "checks": len(out),
        "max_s": max(out, default=0.0),
        "median_s": statistics.median(out) if out else 0.0,
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
