"""The access log (``--access-log text|json``): one line per request on stderr.

Each line holds the request's start time, the router's request id (and the client's
``X-Request-Id`` when it sent one), the API key's *name* (never the key), model, route,
worker, status, time to first token and duration in milliseconds, prompt / cached /
completion tokens (the engine's usage report) and retries. Never a prompt, an answer or a
header value other than the client's request id. ``--access-log-sample`` keeps a fraction
of the requests (decided when each starts: a request not logged costs one random draw).
"""

from __future__ import annotations

import json
import logging
import random
import re
import sys
import time
from typing import Any, Literal, TextIO

from infera_core.request import RequestContext

log = logging.getLogger("infera.access")

_CACHED_RE = re.compile(rb'"cached_tokens"\s*:\s*(\d+)')


def cached_of(data: bytes) -> int:
    """``cached_tokens`` of the last usage report in ``data`` (0 when absent)."""
    at = data.rfind(b'"cached_tokens"')
    if at < 0:
        return 0
    m = _CACHED_RE.match(data, at)
    return int(m.group(1)) if m is not None else 0


class AccessRecord:
    """What one logged request collects on its way (set on ``ctx.access``)."""

    __slots__ = ("cached", "completion", "prompt", "retries", "ttft", "wall", "worker")

    def __init__(self) -> None:
        self.wall = time.time()
        self.worker: str | None = None
        self.ttft: float | None = None
        self.prompt = 0
        self.cached = 0
        self.completion = 0
        self.retries = 0


def _text_value(v: Any) -> str:
    if v is None:
        return "-"
    s = str(v)
    if not s or any(c in s for c in ' "=\\') or not s.isprintable():
        return json.dumps(s)
    return s


def fields(
    rec: AccessRecord,
    ctx: RequestContext | None,
    route: str,
    model: str,
    status: int,
    seconds: float,
) -> dict[str, Any]:
    """The fields of one request's line."""
    principal = ctx.principal if ctx is not None else None
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(rec.wall))
        + f".{int(rec.wall * 1000) % 1000:03d}Z",
        "request_id": ctx.request_id if ctx is not None else None,
        "client_request_id": ctx.client_request_id[:128]
        if ctx is not None and ctx.client_request_id
        else None,
        "key": getattr(principal, "name", None),
        "route": route,
        "model": model,
        "worker": rec.worker,
        "status": status,
        "ttft_ms": round(rec.ttft * 1000, 1) if rec.ttft is not None else None,
        "duration_ms": round(seconds * 1000, 1),
        "prompt_tokens": rec.prompt,
        "cached_tokens": rec.cached,
        "completion_tokens": rec.completion,
        "retries": rec.retries,
    }


class AccessLog:
    """Writes the lines; ``stream`` is where (stderr by default)."""

    def __init__(self, mode: Literal["text", "json"], sample: float, stream: TextIO | None = None) -> None:
        self.mode = mode
        self.sample = sample
        self.stream = stream

    def start(self) -> AccessRecord | None:
        """A record for a request that is to be logged, None for one that is not (sampling)."""
        if self.sample < 1.0 and (self.sample <= 0.0 or random.random() >= self.sample):
            return None
        return AccessRecord()

    def write(self, f: dict[str, Any]) -> None:
        """One line of :func:`fields`."""
        if self.mode == "json":
            line = json.dumps(f, separators=(",", ":"))
        else:
            line = " ".join(f"{k}={_text_value(v)}" for k, v in f.items())
        out = self.stream if self.stream is not None else sys.stderr
        try:
            out.write(line + "\n")
            out.flush()
        except (OSError, ValueError):  # stderr closed: the request is not the log's victim
            log.debug("access log line lost")
