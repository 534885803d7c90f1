"""The Responses API of the sim: create (whole or streamed), retrieve, delete, input items, cancel.

Like vLLM started with ``VLLM_ENABLE_RESPONSES_API_STORE=1``, stored responses live in this
process (the newest :data:`MAX_STORED`), so a ``previous_response_id`` only works on the sim that
answered it; a streamed answer sends the real event sequence (``event: response.created`` …
``response.output_text.delta`` … ``response.completed``, each ``data:`` a JSON object with
``type`` and ``sequence_number``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import msgspec
from aiohttp import web

from infera_core.util.responses_input import chat_messages
from infera_sim.config import SimConfig
from infera_sim.engine import SimEngine
from infera_sim.openai_api import ApiError, parse
from infera_sim.request import SimRequest
from infera_sim.tokenizer import EngineTokenizer

MAX_STORED = 10_000
_RENAMED = {"messages": "input", "max_tokens": "max_output_tokens"}
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


def _not_found(response_id: str) -> ApiError:
    return ApiError(
        f"Response with id '{response_id}' not found.", "response_id", 404, "invalid_request_error"
    )


def _reply(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=_encode(obj), status=status, content_type="application/json")


class Stored:
    """One stored response: the answer, its input items, and the whole conversation so far."""

    __slots__ = ("items", "messages", "response")

    def __init__(self, response: dict[str, Any], items: list[dict[str, Any]], messages: list[dict[str, Any]]):
        self.response = response
        self.items = items
        self.messages = messages


class SimResponses:
    """Handlers of ``/v1/responses*``. ``engine_for`` picks the engine (DP rank) of a request."""

    def __init__(
        self, cfg: SimConfig, tokenizer: EngineTokenizer, engine_for: Callable[[web.Request], SimEngine]
    ) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.engine_for = engine_for
        self.store: OrderedDict[str, Stored] = OrderedDict()

    def _stored(self, request: web.Request) -> Stored:
        rid = request.match_info["response_id"]
        found = self.store.get(rid)
        if found is None:
            raise _not_found(rid)
        return found

    async def create(self, request: web.Request) -> web.StreamResponse:
        try:
            body = _decode(await request.read())
            if not isinstance(body, dict):
                raise ApiError("The request body must be a JSON object")
            prev_id = body.get("previous_response_id")
            before: list[dict[str, Any]] = []
            if prev_id is not None:
                prev = self.store.get(prev_id)
                if prev is None:
                    raise _not_found(prev_id)
                before = prev.messages
            if not isinstance(body.get("input"), str | list):
                raise ApiError("'input' must be a string or an array of input items", "input")
            messages = [*before, *chat_messages(body)]
            chat = {"model": body.get("model"), "messages": messages}
            for name in ("max_output_tokens", "seed", "cache_salt"):
                if body.get(name) is not None:
                    chat["max_tokens" if name == "max_output_tokens" else name] = body[name]
            parsed = parse(chat, self.tokenizer, self.cfg, True)
            engine = self.engine_for(request)
        except msgspec.DecodeError as exc:
            return _reply(ApiError(f"Invalid JSON body: {exc}").body(), 400)
        except ApiError as err:
            named = _RENAMED.get(err.param or "")
            if named is not None:  # said in the Responses API's words
                err = ApiError(err.message.replace(err.param or "", named), named, err.status, err.type)
            return _reply(err.body(), err.status)
        rid = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        [req] = parsed.make_requests(rid)
        req.wake = asyncio.Event()
        req.stream = bool(body.get("stream"))
        engine.add(req)
        answer = _response(body, f"resp_{uuid.uuid4().hex}", self.cfg.model, prev_id)
        try:
            if req.stream:
                return await self._stream(request, req, answer, messages, body)
            while not req.done:
                await req.wake.wait()
                req.wake.clear()
            self._finish(answer, req, messages, body)
            return _reply(answer)
        finally:
            if not req.done:
                engine.abort(req)

    def _finish(
        self, answer: dict[str, Any], req: SimRequest, messages: list[dict[str, Any]], body: dict[str, Any]
    ) -> dict[str, Any]:
        """Fill the completed answer and store it (unless ``store`` is false); its message item."""
        choice = req.choices[0]
        item = _message_item(answer["id"], choice.text, "completed")
        answer["output"] = [item]
        answer["status"] = "completed" if choice.finish_reason != "length" else "incomplete"
        if choice.finish_reason == "length":
            answer["incomplete_details"] = {"reason": "max_output_tokens"}
        p, c = len(req.prompt), len(choice.tokens)
        answer["usage"] = {
            "input_tokens": p,
            "input_tokens_details": {"cached_tokens": req.num_cached},
            "output_tokens": c,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": p + c,
        }
        if body.get("store") is not False:
            items = body["input"]
            if isinstance(items, str):
                items = [{"role": "user", "content": items}]
            listed = [_input_item(i) for i in items if isinstance(i, dict)]
            convo = [*messages, {"role": "assistant", "content": choice.text}]
            self.store[answer["id"]] = Stored(answer, listed, convo)
            while len(self.store) > MAX_STORED:
                self.store.popitem(last=False)
        return item

    async def _stream(
        self,
        request: web.Request,
        req: SimRequest,
        answer: dict[str, Any],
        messages: list[dict[str, Any]],
        body: dict[str, Any],
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        seq = 0

        def event(kind: str, **fields: Any) -> bytes:
            nonlocal seq
            data = _encode({"type": kind, "sequence_number": seq, **fields})
            seq += 1
            return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"

        item_id = f"msg_{answer['id'][5:]}"
        at = {"item_id": item_id, "output_index": 0, "content_index": 0}
        await resp.write(
            event("response.created", response=answer)
            + event("response.in_progress", response=answer)
            + event(
                "response.output_item.added",
                output_index=0,
                item=_message_item(answer["id"], None, "in_progress"),
            )
            + event("response.content_part.added", **at, part=_text_part(""))
        )
        while True:
            await req.wake.wait()  # type: ignore[union-attr]
            req.wake.clear()  # type: ignore[union-attr]
            output, req.output = req.output, []
            chunks = [
                event("response.output_text.delta", **at, delta=piece, logprobs=[])
                for _, _, piece, _ in output
            ]
            if chunks:
                await resp.write(b"".join(chunks))
            if req.done and not req.output:
                break
        item = self._finish(answer, req, messages, body)
        text = req.choices[0].text
        await resp.write(
            event("response.output_text.done", **at, text=text, logprobs=[])
            + event("response.content_part.done", **at, part=_text_part(text))
            + event("response.output_item.done", output_index=0, item=item)
            + event("response.completed", response=answer)
        )
        await resp.write_eof()
        return resp

    async def retrieve(self, request: web.Request) -> web.Response:
        try:
            return _reply(self._stored(request).response)
        except ApiError as err:
            return _reply(err.body(), err.status)

    async def delete(self, request: web.Request) -> web.Response:
        try:
            self._stored(request)
        except ApiError as err:
            return _reply(err.body(), err.status)
        rid = request.match_info["response_id"]
        del self.store[rid]
        return _reply({"id": rid, "object": "response", "deleted": True})

    async def input_items(self, request: web.Request) -> web.Response:
        try:
            items = self._stored(request).items
        except ApiError as err:
            return _reply(err.body(), err.status)
        if request.query.get("order", "desc") == "desc":
            items = items[::-1]
        ids = [i.get("id") for i in items if isinstance(i, dict)]
        return _reply(
            {
                "object": "list",
                "data": items,
                "first_id": ids[0] if ids else None,
                "last_id": ids[-1] if ids else None,
                "has_more": False,
            }
        )

    async def cancel(self, request: web.Request) -> web.Response:
        try:
            self._stored(request)
        except ApiError as err:
            return _reply(err.body(), err.status)
        # as vLLM answers for a response that did not run in the background (none does here)
        sync = ApiError("Cannot cancel a synchronous response.", "response_id")
        return _reply(sync.body(), sync.status)

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_post("/v1/responses", self.create)
        router.add_get("/v1/responses/{response_id}", self.retrieve)
        router.add_delete("/v1/responses/{response_id}", self.delete)
        router.add_get("/v1/responses/{response_id}/input_items", self.input_items)
        router.add_post("/v1/responses/{response_id}/cancel", self.cancel)


def _input_item(item: dict[str, Any]) -> dict[str, Any]:
    """An input item as ``input_items`` lists it: with an id and a type, text as parts."""
    out = {"id": f"msg_{uuid.uuid4().hex}", "type": "message", **item}
    if isinstance(out.get("content"), str):
        out["content"] = [{"type": "input_text", "text": out["content"]}]
    return out


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(response_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [_text_part(text)]
    return {
        "id": f"msg_{response_id[5:]}",
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": content,
    }


def _response(body: dict[str, Any], rid: str, model: str, prev: object) -> dict[str, Any]:
    """The response object, in progress: what ``response.created`` carries."""
    return {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "model": model,
        "output": [],
        "instructions": body.get("instructions"),
        "previous_response_id": prev,
        "max_output_tokens": body.get("max_output_tokens"),
        "temperature": body.get("temperature", 1.0),
        "top_p": body.get("top_p", 1.0),
        "tools": body.get("tools") or [],
        "tool_choice": body.get("tool_choice", "auto"),
        "parallel_tool_calls": True,
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "store": body.get("store") is not False,
        "background": False,
        "metadata": body.get("metadata"),
        "error": None,
        "incomplete_details": None,
        "usage": None,
    }
