"""``POST /v1/messages``: the Anthropic Messages API on top of a worker's chat completions."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp

from infera_core.scheduling.types import RequestContext
from infera_core.server.anthropic import to_chat_request, to_message_response
from infera_core.server.anthropic_stream import MessageStream
from infera_core.server.asgi import (
    SSE_HEADERS,
    ClientGone,
    Receive,
    Scope,
    Send,
    header_dict,
    raw_header,
    read_body,
    send_bytes,
    send_error,
)
from infera_core.server.core import RouterCore, watch_disconnect
from infera_core.server.errors import ApiError
from infera_core.server.validate import check_messages, parse_object

ROUTE = "/v1/messages"
CHAT_PATH = "/v1/chat/completions"


class MessagesProxy:
    """A raw ASGI endpoint translating Anthropic Messages to chat completions and back."""

    def __init__(self, core: RouterCore, max_body: int) -> None:
        self.core = core
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        t0 = time.perf_counter()
        core = self.core
        model = "-"
        status = 500
        watcher: asyncio.Task[None] | None = None
        gone: list[bool] = []
        try:
            body = parse_object(await read_body(scope, receive, self.max_body))
            model = check_messages(body)
            chat = to_chat_request(body)
            headers = header_dict(scope)
            ctx = RequestContext(
                core.request_id(raw_header(scope, b"x-request-id")), model, ROUTE, chat, headers
            )
            task = asyncio.current_task()
            assert task is not None
            watcher = asyncio.ensure_future(watch_disconnect(receive, task, gone))
            ep, resp = await core.dispatch(ctx, CHAT_PATH, json.dumps(chat).encode())
            status = resp.status
            ok = False
            try:
                ok = await self._relay(send, resp, model, body.get("stop_sequences"), ep.worker_id)
            finally:
                resp.release()
                core.release(ctx, ep, ok)
        except ApiError as err:
            status = err.status
            await send_error(send, err, anthropic=True)
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
            core.metrics.request_done(ROUTE, model, status, time.perf_counter() - t0)

    async def _relay(
        self, send: Send, resp: aiohttp.ClientResponse, model: str, stops: object, worker: str
    ) -> bool:
        ctype = resp.headers.get("Content-Type", "")
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
                chat = json.loads(await resp.read())
            except (ValueError, aiohttp.ClientError, OSError, TimeoutError) as exc:
                await send_error(
                    send, ApiError(502, f"Worker {worker} sent a bad response: {exc}"), anthropic=True
                )
                return False
            out = to_message_response(chat if isinstance(chat, dict) else {}, model, stops)
            usage = out["usage"]
            self.core.metrics.usage(model, usage["input_tokens"], usage["output_tokens"])
            await send_bytes(send, 200, json.dumps(out).encode())
            return True
        await send({"type": "http.response.start", "status": 200, "headers": list(SSE_HEADERS)})
        stream = MessageStream(model, stops)
        try:
            async for chunk in resp.content.iter_any():
                out_bytes = stream.feed(chunk)
                if out_bytes:
                    await send({"type": "http.response.body", "body": out_bytes, "more_body": True})
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            tail = stream.error(f"Worker {worker} failed mid-stream: {exc!r}")
            await send({"type": "http.response.body", "body": tail, "more_body": False})
            return False
        await send({"type": "http.response.body", "body": stream.finish(), "more_body": False})
        self.core.metrics.usage(model, stream.input_tokens, stream.output_tokens)
        return True
