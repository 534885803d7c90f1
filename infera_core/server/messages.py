"""``POST /v1/messages``: the Anthropic Messages API on top of a worker's chat completions."""

from __future__ import annotations

import json
from typing import Any

from infera_core.request import RequestContext
from infera_core.scheduling.types import Endpoint
from infera_core.server.anthropic import to_chat_request, to_message_response
from infera_core.server.anthropic_stream import MessageStream
from infera_core.server.asgi import (
    SSE_HEADERS,
    Scope,
    Send,
    header_dict,
    send_bytes,
    send_error,
)
from infera_core.server.core import RouterCore
from infera_core.server.endpoint import ProxyEndpoint
from infera_core.server.errors import ApiError
from infera_core.server.legs import Broken, read_whole, relay_legs
from infera_core.server.validate import BodyLimits, check_messages
from infera_core.transports.upstreams import UpstreamResponse

ROUTE = "/v1/messages"
CHAT_PATH = "/v1/chat/completions"


class MessagesProxy(ProxyEndpoint):
    """A raw ASGI endpoint translating Anthropic Messages to chat completions and back."""

    anthropic = True

    def __init__(self, core: RouterCore, limits: BodyLimits) -> None:
        super().__init__(core, ROUTE, limits)

    def prepare(self, scope: Scope, raw: bytes, body: dict[str, Any]) -> tuple[RequestContext, str, bytes]:
        model = check_messages(body)
        chat = to_chat_request(body)
        headers = header_dict(scope)
        if self.migrator is not None:  # token-exact migration where the engines stream their ids
            _, chat = self.migrator.ask_ids(b"{}", chat, model, headers, True)
        ctx = RequestContext(self.core.request_id(), model, ROUTE, chat, headers)
        return ctx, CHAT_PATH, json.dumps(chat).encode()

    async def relay(
        self, send: Send, resp: UpstreamResponse, ctx: RequestContext, ep: Endpoint, t0: float
    ) -> bool:
        return await self._relay(send, resp, ctx, ctx.body.get("stop"), ep.worker_id)

    async def _relay(
        self, send: Send, resp: UpstreamResponse, ctx: RequestContext, stops: object, worker: str
    ) -> bool:
        model = ctx.model
        ctype = resp.content_type
        if resp.status >= 400:
            data = await resp.read()
            try:
                message = json.loads(data)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = data[:300].decode("utf-8", "replace")
            await send_error(send, ApiError(resp.status, f"Worker {worker}: {message}"), anthropic=True)
            return False
        if not ctype.startswith("text/event-stream"):
            try:
                whole = await read_whole(self.core, self.migrator, ctx, CHAT_PATH, resp, worker)
                chat = json.loads(whole.data)
            except (Broken, ValueError) as exc:
                await send_error(
                    send,
                    ApiError(
                        502,
                        exc.message
                        if isinstance(exc, Broken)
                        else f"Worker {worker} sent a bad response: {exc}",
                    ),
                    anthropic=True,
                )
                return False
            out = to_message_response(chat if isinstance(chat, dict) else {}, model, stops)
            usage = out["usage"]
            self.count_usage(ctx, usage["input_tokens"], usage["output_tokens"])
            await send_bytes(send, 200, json.dumps(out).encode())
            return True
        await send({"type": "http.response.start", "status": 200, "headers": list(SSE_HEADERS)})
        stream = MessageStream(model, stops)
        mig = self.migrator
        live = mig.watch(ctx, worker, True) if mig is not None else None
        kept: list[bytes] | None = [] if live is not None and live.refused is None else None

        async def emit(chunk: bytes) -> None:
            out_bytes = stream.feed(chunk)
            if out_bytes:
                await send({"type": "http.response.body", "body": out_bytes, "more_body": True})

        ended = False
        try:
            await relay_legs(self.core, mig, live, ctx, CHAT_PATH, True, resp, worker, emit, kept)
            ended = True
        except Broken as exc:
            tail = stream.error(exc.message)
            await send({"type": "http.response.body", "body": tail, "more_body": False})
            return False
        finally:
            if mig is not None:
                mig.done(live)
            if not ended or not (stream.input_tokens or stream.output_tokens):
                self.count_relayed(ctx, stream.events - 1)  # no usage report: what passed
            else:
                self.count_usage(ctx, stream.input_tokens, stream.output_tokens)
        await send({"type": "http.response.body", "body": stream.finish(), "more_body": False})
        return True
