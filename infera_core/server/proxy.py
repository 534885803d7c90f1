"""``POST /v1/chat/completions`` and ``/v1/completions``: a raw-ASGI pass-through.

The client's bytes go to the worker unchanged; the worker's bytes come back
unchanged (SSE passed through as received with ``iter_any()``, never re-encoded).
Per chunk the only work is counting ``data: `` and one clock read; with the native
transport a chunk is written to the client from the worker connection's read callback
(:mod:`infera_core.server.splice`), without waking the request's task. A client
disconnect cancels the upstream request; a worker failing mid-stream ends the
client's stream with an SSE error event.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from infera_core.request import RequestContext
from infera_core.scheduling.types import Endpoint
from infera_core.server.access_log import cached_of
from infera_core.server.asgi import (
    SSE_HEADERS,
    Scope,
    Send,
    header_dict,
    send_error,
)
from infera_core.server.core import RouterCore, usage_of
from infera_core.server.endpoint import ProxyEndpoint
from infera_core.server.errors import ApiError
from infera_core.server.legs import Broken, read_whole, relay_legs
from infera_core.server.migrate import IdsAdded, strip_ids
from infera_core.server.splice import StreamTally
from infera_core.server.usage import (
    UsageStripper,
    answer_usage,
    asking_usage,
    client_wants_usage,
    router_added_usage,
    with_stream_usage,
)
from infera_core.server.validate import BodyLimits
from infera_core.transports.http.http1 import Http1Response
from infera_core.transports.upstreams import UpstreamResponse

log = logging.getLogger("infera.server.proxy")

CHAT_ROUTE = "/v1/chat/completions"

Checker = Callable[[dict[str, Any]], str]


class OpenAIProxy(ProxyEndpoint):
    """A raw ASGI endpoint forwarding one OpenAI route to the fleet, bytes unchanged."""

    def __init__(self, core: RouterCore, route: str, check: Checker, limits: BodyLimits) -> None:
        super().__init__(core, route, limits)
        self.check = check

    def prepare(self, scope: Scope, raw: bytes, body: dict[str, Any]) -> tuple[RequestContext, str, bytes]:
        model = self.check(body)
        if self.auth is not None and body.get("stream") is True and not client_wants_usage(body):
            # tokens per API key need the stream's usage: ask the engine (PD legs too), hide it after
            raw = with_stream_usage(raw, body)
            body = asking_usage(body)
        headers = header_dict(scope)
        if self.migrator is not None:  # token-exact migration where the engines stream their ids
            raw, body = self.migrator.ask_ids(raw, body, model, headers, self.route == CHAT_ROUTE)
        ctx = RequestContext(self.core.request_id(), model, self.route, body, headers)
        return ctx, self.route, raw

    async def relay(
        self, send: Send, resp: UpstreamResponse, ctx: RequestContext, ep: Endpoint, t0: float
    ) -> bool:
        return await self._relay(send, resp, ctx, t0, ep.worker_id)

    async def _relay(
        self, send: Send, resp: UpstreamResponse, ctx: RequestContext, t0: float, worker: str
    ) -> bool:
        ctype = resp.content_type or "application/json"
        if not ctype.startswith("text/event-stream"):
            try:
                whole = await read_whole(self.core, self.migrator, ctx, self.route, resp, worker)
            except Broken as exc:
                await send_error(send, ApiError(502, exc.message))
                return False
            data = whole.data
            headers = [
                (b"content-type", whole.content_type.encode("latin-1")),
                (b"content-length", str(len(data)).encode()),
                (b"x-infera-worker", whole.worker.encode("latin-1")),
            ]
            if whole.status < 400:  # counted before it is sent: a client leaving now still pays
                p, c = answer_usage(data)
                cached = cached_of(data)
                if ctx.access is not None:
                    ctx.access.cached = cached
                self.count_usage(ctx, p, c, cached)
            await send({"type": "http.response.start", "status": whole.status, "headers": headers})
            await send({"type": "http.response.body", "body": data, "more_body": False})
            return whole.status < 400
        await send(
            {
                "type": "http.response.start",
                "status": resp.status,
                "headers": [*SSE_HEADERS, (b"x-infera-worker", worker.encode("latin-1"))],
            }
        )
        tally = StreamTally()
        tally.on_first = lambda: self.core.first_token(ctx, worker)
        strip = UsageStripper() if router_added_usage(ctx.body) else None
        mig = self.migrator
        live = mig.watch(ctx, worker, self.route == CHAT_ROUTE) if mig is not None else None
        kept: list[bytes] | None = [] if live is not None and live.refused is None else None
        tally.kept = kept
        # the native transport hands chunks to the client's transport as they are parsed
        # (no task wake-up per chunk); what it declines comes through the loop below
        ids = isinstance(ctx.body, IdsAdded)  # the router asked for token ids: not for the client
        direct = strip is None and not ids and type(resp) is Http1Response
        sink = tally if direct and tally.attach(send) else None

        async def emit(chunk: bytes) -> None:
            if ids:
                chunk = strip_ids(chunk)
            if strip is not None:
                chunk = strip.feed(chunk)
                if not chunk:
                    return
            tally.note(chunk)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})

        ended = False
        try:
            await relay_legs(
                self.core,
                mig,
                live,
                ctx,
                self.route,
                self.route == CHAT_ROUTE,
                resp,
                worker,
                emit,
                kept,
                sink,
            )
            ended = True
        except Broken as exc:
            err = ApiError(502, exc.message, code="upstream_stream_error")
            await send({"type": "http.response.body", "body": err.sse_event(), "more_body": False})
            return False
        finally:
            if mig is not None:
                mig.done(live)
            if not ended:  # the client left or the worker failed: charge what passed
                self._count_stream(ctx, tally, strip, None)
        rest = strip.flush() if strip is not None else b""
        self._count_stream(ctx, tally, strip, t0, worker)
        await send({"type": "http.response.body", "body": rest, "more_body": False})
        return True

    def _count_stream(
        self,
        ctx: RequestContext,
        tally: StreamTally,
        strip: UsageStripper | None,
        t0: float | None,
        worker: str = "",
    ) -> None:
        """A stream's usage: the engine's report when one passed, else what was relayed; and
        its timing when it was relayed whole (``t0``: its start), also for the scorers that
        learn each worker's latency (``worker``: who answered)."""
        first, last, events = tally.first, tally.last, tally.events
        end = tally.prev + tally.tail
        if b"[DONE]" in end:
            events -= 1
        # the engine's report: taken out of the stream when the client did not ask for it
        cached = strip.cached if strip is not None and strip.prompt else cached_of(end[-1200:])
        if ctx.access is not None:
            ctx.access.cached = cached
            if first and t0 is not None:
                ctx.access.ttft = first - t0
        if first and t0 is not None:
            itl = (last - first) / (events - 1) if events > 1 else None
            self.core.metrics.stream_timing(ctx.model, first - t0, itl)
            self.core.stream_timed(ctx, worker, time.perf_counter() - first, itl)
        p, c = (strip.prompt, strip.completion) if strip is not None else usage_of(end[-1200:])
        if p or c:
            self.count_usage(ctx, p, c, cached)
        else:
            self.count_relayed(ctx, events - 1)
