"""``POST /v1/chat/completions`` and ``/v1/completions``: a raw-ASGI pass-through.

The client's bytes go to the worker unchanged; the worker's bytes come back
unchanged (SSE passed through as received with ``iter_any()``, never re-encoded).
Per chunk the only work is counting ``data: `` and one clock read. A client
disconnect cancels the upstream request; a worker failing mid-stream ends the
client's stream with an SSE error event.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from infera_core.scheduling.types import RequestContext
from infera_core.server.asgi import (
    SSE_HEADERS,
    ClientGone,
    Receive,
    Scope,
    Send,
    header_dict,
    raw_header,
    read_body,
    send_error,
)
from infera_core.server.core import RouterCore, usage_of, watch_disconnect
from infera_core.server.errors import ApiError
from infera_core.server.validate import parse_object

log = logging.getLogger("infera.server.proxy")

Checker = Callable[[dict[str, Any]], str]


class OpenAIProxy:
    """A raw ASGI endpoint forwarding one OpenAI route to the fleet."""

    def __init__(self, core: RouterCore, route: str, check: Checker, max_body: int) -> None:
        self.core = core
        self.route = route
        self.check = check
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        t0 = time.perf_counter()
        core = self.core
        model = "-"
        status = 500
        watcher: asyncio.Task[None] | None = None
        gone: list[bool] = []
        try:
            raw = await read_body(scope, receive, self.max_body)
            body = parse_object(raw)
            model = self.check(body)
            headers = header_dict(scope)
            ctx = RequestContext(
                core.request_id(raw_header(scope, b"x-request-id")), model, self.route, body, headers
            )
            task = asyncio.current_task()
            assert task is not None
            watcher = asyncio.ensure_future(watch_disconnect(receive, task, gone))
            ep, resp = await core.dispatch(ctx, self.route, raw)
            status = resp.status
            ok = False
            try:
                ok = await self._relay(send, resp, model, t0, ep.worker_id)
            finally:
                resp.release()
                core.release(ctx, ep, ok)
        except ApiError as err:
            status = err.status
            if err.code == "model_not_found":
                model = "-"
            await send_error(send, err)
        except ClientGone:
            status = 499
        except asyncio.CancelledError:
            if not gone:
                raise
            status = 499
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
        finally:
            if watcher is not None and not watcher.done():
                watcher.cancel()
            core.metrics.request_done(self.route, model, status, time.perf_counter() - t0)

    async def _relay(
        self, send: Send, resp: aiohttp.ClientResponse, model: str, t0: float, worker: str
    ) -> bool:
        ctype = resp.headers.get("Content-Type", "application/json")
        metrics = self.core.metrics
        if not ctype.startswith("text/event-stream"):
            try:
                data = await resp.read()
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                await send_error(send, ApiError(502, f"Worker {worker} failed while responding: {exc!r}"))
                return False
            headers = [
                (b"content-type", ctype.encode("latin-1")),
                (b"content-length", str(len(data)).encode()),
                (b"x-infera-worker", worker.encode("latin-1")),
            ]
            await send({"type": "http.response.start", "status": resp.status, "headers": headers})
            await send({"type": "http.response.body", "body": data, "more_body": False})
            if resp.status < 400:
                p, c = usage_of(data[-600:])
                metrics.usage(model, p, c)
            return resp.status < 400
        await send(
            {
                "type": "http.response.start",
                "status": resp.status,
                "headers": [*SSE_HEADERS, (b"x-infera-worker", worker.encode("latin-1"))],
            }
        )
        first = last = 0.0
        events = 0
        prev = tail = b""
        try:
            async for chunk in resp.content.iter_any():
                last = time.perf_counter()
                if not first:
                    first = last
                events += chunk.count(b"data: ")
                prev, tail = tail, chunk
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.warning("worker %s failed mid-stream: %r", worker, exc)
            err = ApiError(502, f"Worker {worker} failed mid-stream: {exc!r}", code="upstream_stream_error")
            await send({"type": "http.response.body", "body": err.sse_event(), "more_body": False})
            return False
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        if first:
            end = prev + tail
            if b"[DONE]" in end:
                events -= 1
            metrics.stream_timing(model, first - t0, (last - first) / (events - 1) if events > 1 else None)
            p, c = usage_of(end[-1200:])
            metrics.usage(model, p, c)
        return True
