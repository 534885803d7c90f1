"""``POST /v1/messages/count_tokens`` (Anthropic) and Anthropic-shaped errors on ``/v1/messages*``.

The conversation is mapped to the chat request ``/v1/messages`` would send
(:func:`~infera_core.server.anthropic.to_chat_request`), then counted:

1. by the router itself, with the model's routing tokenizer (a ``--tokenizer`` or the model
   card's tokenizer and chat template), the whole conversation, template applied as the
   engine applies it — no worker is asked;
2. otherwise by a worker: the request as received to the engine's own
   ``/v1/messages/count_tokens`` (vLLM serves it), and where the engine has no such route
   (SGLang, older vLLM, the sim) the chat request to its ``/tokenize`` (``count``).

Answer: ``{"input_tokens": N}``, as Anthropic's API gives; errors in Anthropic's shape.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from infera_core.server.anthropic import to_chat_request
from infera_core.server.core import RouterCore
from infera_core.server.errors import ApiError, bad_request
from infera_core.server.kv import KvComponent
from infera_core.server.observed import Observed, answer_observed
from infera_core.server.tokenize_routes import forward, read_request, workers_for
from infera_core.server.validate import BodyLimits

ROUTE = "/v1/messages/count_tokens"
_OFFLOAD_CHARS = 16384
"""Conversations longer than this are tokenized in a thread (off the event loop)."""


def anthropic_error(err: ApiError) -> Response:
    return Response(
        err.anthropic_body(), err.status, headers=err.headers or None, media_type="application/json"
    )


def check_count(body: dict[str, Any]) -> str:
    """The model of a valid count_tokens request (``model`` and non-empty ``messages``)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' must be a non-empty string.", "model", "invalid_type")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty array.", "messages", "invalid_type")
    return model


async def count_here(kv: KvComponent | None, model: str, chat: dict[str, Any]) -> int | None:
    """Tokens of ``chat`` by the router's own tokenizer for ``model``; None without one."""
    tok = kv.tokenizer(model) if kv is not None else None
    if tok is None:
        return None
    messages = chat["messages"]
    if len(json.dumps(messages)) > _OFFLOAD_CHARS:
        return len(await asyncio.to_thread(tok.encode_chat, messages, chat))
    return len(tok.encode_chat(messages, chat))


async def count_by_worker(
    core: RouterCore,
    model: str,
    raw: bytes,
    chat: dict[str, Any],
    via: bytes | None,
    obs: Observed | None = None,
) -> Response:
    """The engine's count: its ``/v1/messages/count_tokens``, else its ``/tokenize``."""
    try:
        resp = await forward(core, model, ROUTE, raw, via, obs)
    except ApiError as err:
        if err.status != 501:  # 501: no worker of the model has the route
            raise
    else:
        if resp.status_code >= 400:
            raise _engine_error(resp)
        return resp
    ask = {k: v for k, v in chat.items() if k not in ("max_tokens", "stream", "stream_options", "user")}
    ask["add_generation_prompt"] = True
    resp = await forward(core, model, "/tokenize", json.dumps(ask).encode(), via, obs)
    if resp.status_code >= 400:
        raise _engine_error(resp)
    try:
        count = json.loads(bytes(resp.body))["count"]
    except (ValueError, KeyError, TypeError):
        raise ApiError(502, "The worker's /tokenize answer has no 'count'.", code="upstream_error") from None
    worker = resp.headers.get("x-infera-worker", "")
    return JSONResponse({"input_tokens": int(count)}, headers={"x-infera-worker": worker})


def _engine_error(resp: Response) -> ApiError:
    """A worker's error answer as the client's error (its message, Anthropic-shaped)."""
    try:
        data = json.loads(bytes(resp.body))
        err = data.get("error") if isinstance(data, dict) else None
        message = err.get("message") if isinstance(err, dict) else None
    except ValueError:
        message = None
    text = message if isinstance(message, str) else bytes(resp.body)[:300].decode("utf-8", "replace")
    return ApiError(resp.status_code, f"Worker: {text}")


def add_count_tokens_route(
    app: FastAPI, core: RouterCore, kv: KvComponent | None, limits: BodyLimits
) -> None:
    """Mount ``POST /v1/messages/count_tokens``."""

    async def count_tokens(request: Request) -> Response:
        async def run(obs: Observed) -> Response:
            auth, principal, raw, via, body = await read_request(request, core, limits)
            obs.ctx.principal = principal
            name = check_count(body)
            workers_for(core, name)  # 404 for an unknown model, 503 with none available
            obs.model = name
            if auth is not None and principal is not None:
                await auth.admit_waiting(principal, name)
            chat = to_chat_request({**body, "max_tokens": 1})
            n = await count_here(kv, name, chat)
            if n is None:
                return await count_by_worker(core, name, raw, chat, via, obs)
            return JSONResponse({"input_tokens": n})

        return await answer_observed(request, ROUTE, core.request_id(), core.metrics, run, anthropic_error)

    app.add_api_route(ROUTE, count_tokens, methods=["POST"], include_in_schema=False)
