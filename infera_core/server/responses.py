"""``POST /v1/responses``: the OpenAI Responses API, routed like chat, pinned where it must be.

The body goes to the worker unchanged and its answer comes back unchanged (a stream's
``event: response.*`` SSE as received). Routing reads the request as the chat it stands for
(:func:`~infera_core.util.responses_input.chat_messages`): KV-aware on its rendered template
where the model has a routing tokenizer, by text or load otherwise. The router notes which
worker served each stored response (``store`` is not false); a request naming
``previous_response_id`` goes to that worker and no other (:mod:`.responses_routes` finds it,
or answers a 404). A broken Responses stream is not continued on another worker: the response
being stored lives on the worker that began it.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

from infera_core.request import RequestContext
from infera_core.scheduling.types import Endpoint
from infera_core.server.access_log import cached_of
from infera_core.server.asgi import SSE_HEADERS, Scope, Send, header_dict, send_error
from infera_core.server.core import RouterCore
from infera_core.server.endpoint import ProxyEndpoint
from infera_core.server.errors import ApiError, bad_request
from infera_core.server.legs import Broken, relay_legs
from infera_core.server.response_owners import ResponseOwners, response_id_of
from infera_core.server.responses_routes import ResponseLocator
from infera_core.server.validate import BodyLimits, check_model
from infera_core.transports.upstreams import READ_ERRORS, UpstreamResponse
from infera_core.util.responses_input import chat_messages

ROUTE = "/v1/responses"
_ID_WINDOW = 64 * 1024
"""Bytes of a stream's start searched for the response id (its first event carries it)."""
_DELTA = b"event: response.output_text.delta"
_INPUT_RE = re.compile(rb'"input_tokens"\s*:\s*(\d+)')
_OUTPUT_RE = re.compile(rb'"output_tokens"\s*:\s*(\d+)')
_CHAT_FIELDS = ("user", "tools", "tool_choice", "temperature", "top_p", "stream", "cache_salt", "priority")
"""Fields of a Responses request that mean the same in the chat request routing reads."""


def check_responses(body: dict[str, Any]) -> str:
    """Validate what routing reads of a Responses request; returns the model."""
    model = check_model(body)
    items = body.get("input")
    if items is None:
        raise bad_request("Missing required parameter: 'input'.", "input", "missing_required_parameter")
    if not isinstance(items, str | list):
        raise bad_request("'input' must be a string or an array of input items.", "input", "invalid_type")
    prev = body.get("previous_response_id")
    if prev is not None and (not isinstance(prev, str) or not prev):
        raise bad_request(
            "'previous_response_id' must be a non-empty string.", "previous_response_id", "invalid_type"
        )
    return model


def usage_of_response(data: bytes) -> tuple[int, int]:
    """(input, output) tokens of the last Responses ``usage`` in ``data`` (0 when absent)."""
    found = [_INPUT_RE.findall(data), _OUTPUT_RE.findall(data)]
    return (int(found[0][-1]) if found[0] else 0), (int(found[1][-1]) if found[1] else 0)


class ResponsesProxy(ProxyEndpoint):
    """A raw ASGI endpoint forwarding ``POST /v1/responses``, bytes unchanged."""

    def __init__(self, core: RouterCore, limits: BodyLimits, owners: ResponseOwners) -> None:
        super().__init__(core, ROUTE, limits)
        self.owners = owners
        self.locator = ResponseLocator(core.table, owners)

    def prepare(self, scope: Scope, raw: bytes, body: dict[str, Any]) -> tuple[RequestContext, str, bytes]:
        model = check_responses(body)
        chat: dict[str, Any] = {"model": model, "messages": chat_messages(body)}
        for name in _CHAT_FIELDS:
            if name in body:
                chat[name] = body[name]
        if isinstance(body.get("max_output_tokens"), int):
            chat["max_tokens"] = body["max_output_tokens"]
        if isinstance(body.get("previous_response_id"), str):
            chat["previous_response_id"] = body["previous_response_id"]
        chat["store"] = body.get("store") is not False
        ctx = RequestContext(self.core.request_id(), model, ROUTE, chat, header_dict(scope))
        return ctx, ROUTE, raw

    async def dispatch(
        self, ctx: RequestContext, path: str, body: bytes, task: asyncio.Task[object], via: bytes | None
    ) -> tuple[Endpoint, UpstreamResponse]:
        pd = self.core.pd
        if pd is not None and pd.pairs_only(ctx):
            raise ApiError(
                501,
                f"Model {ctx.model!r} is served by prefill/decode pairs, which do not serve /v1/responses:"
                " use /v1/chat/completions for it.",
                code="unsupported_with_pd",
            )
        prev = ctx.body.get("previous_response_id")
        if not isinstance(prev, str):
            return await self.core.dispatch(ctx, path, body, task, via)
        ep = await self.locator.locate(prev, ctx.model, "previous_response_id")
        peers = self.core.table.candidates(ctx.model)
        if ep not in peers:
            raise bad_request(
                f"Response {prev!r} was answered by model {ep.record.model!r}, not {ctx.model!r}.",
                "previous_response_id",
                "model_mismatch",
            )
        if not ep.record.routable:
            raise ApiError(
                503,
                f"Response {prev!r} is stored on worker {ep.worker_id}, which is {ep.record.status.value}"
                " and takes no new requests; start a new conversation (without previous_response_id).",
                code="worker_draining",
                headers={"Retry-After": "1"},
            )
        # only the holder may answer: every other worker is excluded, retries included
        others = [p.worker_id for p in peers if p is not ep]
        return await self.core.dispatch(ctx, path, body, task, via, exclude=others, queued=False)

    async def relay(
        self, send: Send, resp: UpstreamResponse, ctx: RequestContext, ep: Endpoint, t0: float
    ) -> bool:
        worker = ep.worker_id
        store = ctx.body.get("store") is not False
        ctype = resp.content_type or "application/json"
        if not ctype.startswith("text/event-stream"):
            try:
                data = await resp.read()
            except READ_ERRORS as exc:
                await send_error(send, ApiError(502, f"Worker {worker} failed mid-answer: {exc!r}"))
                return False
            ok = resp.status < 400
            if ok:
                rid = response_id_of(data)
                if store and rid is not None:
                    self.owners.note(rid, worker, ep.record.model)
                if ctx.access is not None:
                    ctx.access.cached = cached_of(data)
                self.count_usage(ctx, *usage_of_response(data))
            headers = [
                (b"content-type", ctype.encode("latin-1")),
                (b"content-length", str(len(data)).encode()),
                (b"x-infera-worker", worker.encode("latin-1")),
            ]
            await send({"type": "http.response.start", "status": resp.status, "headers": headers})
            await send({"type": "http.response.body", "body": data, "more_body": False})
            return ok
        await send(
            {
                "type": "http.response.start",
                "status": resp.status,
                "headers": [*SSE_HEADERS, (b"x-infera-worker", worker.encode("latin-1"))],
            }
        )
        head = bytearray()
        tail = b""
        events = deltas = 0
        first = last = 0.0  # the first and the latest text delta: TTFT and ITL, as for chat
        noted = not store

        async def emit(chunk: bytes) -> None:
            nonlocal tail, events, noted, deltas, first, last
            n = chunk.count(_DELTA)
            if n:
                last = time.perf_counter()
                if not deltas:
                    first = last
                deltas += n
            if not noted:
                head.extend(chunk[: _ID_WINDOW - len(head)])
                rid = response_id_of(bytes(head))
                if rid is not None or len(head) >= _ID_WINDOW:
                    noted = True
                    if rid is not None:
                        self.owners.note(rid, worker, ep.record.model)
            events += chunk.count(b"data: ")
            tail = (tail + chunk)[-4096:]
            await send({"type": "http.response.body", "body": chunk, "more_body": True})

        try:
            await relay_legs(self.core, None, None, ctx, ROUTE, False, resp, worker, emit, None)
        except Broken as exc:
            message = (
                f"{exc.message} (a Responses stream is not continued on another worker: "
                "the response it stores lives on the worker that began it)"
            )
            error = {"type": "error", "code": "upstream_stream_error", "message": message, "param": None}
            data = b"event: error\ndata: " + json.dumps(error).encode() + b"\n\n"
            await send({"type": "http.response.body", "body": data, "more_body": False})
            self.count_relayed(ctx, events)
            return False
        if deltas:
            if ctx.access is not None:
                ctx.access.ttft = first - t0
                ctx.access.cached = cached_of(tail)
            self.core.metrics.stream_timing(
                ctx.model, first - t0, (last - first) / (deltas - 1) if deltas > 1 else None
            )
        p, c = usage_of_response(tail)
        if p or c:
            self.count_usage(ctx, p, c)
        else:
            self.count_relayed(ctx, events)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return True
