"""Server-sent event streams in OpenAI's chunk format (``data: {...}`` … ``data: [DONE]``)."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from aiohttp import web

from infera_sim.openai_api import Parsed, tool_calls, usage
from infera_sim.request import SimRequest

_encode = msgspec.json.Encoder().encode
DONE = b"data: [DONE]\n\n"


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + _encode(obj) + b"\n\n"


async def stream(
    request: web.Request,
    reqs: list[SimRequest],
    parsed: Parsed,
    rid: str,
    created: int,
    model: str,
    chat: bool,
    wake: asyncio.Event,
) -> web.StreamResponse:
    """Write every request's tokens as chunks until all are finished."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    n = parsed.n
    obj = "chat.completion.chunk" if chat else "text_completion"
    tool = parsed.tool_call

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return sse(
            {"id": rid, "object": obj, "created": created, "model": model, "choices": choices, **extra}
        )

    ids = parsed.return_token_ids
    opened: set[int] = set()
    if chat:
        first = [
            {
                "index": ci,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
            for ci in range(n)
        ]
        # vLLM: with return_token_ids the prompt's ids ride on the first chunk
        await resp.write(chunk(first, prompt_token_ids=reqs[0].prompt) if ids else chunk(first))
    while True:
        await wake.wait()
        wake.clear()
        out: list[bytes] = []
        for pi, r in enumerate(reqs):
            output, r.output = r.output, []
            for ci, tok, piece, finish in output:
                if chat:
                    if tool is not None:
                        if finish is None:
                            continue
                        calls = [dict(c, index=0) for c in tool_calls(tool, rid)]
                        choice: dict[str, Any] = {
                            "index": ci,
                            "delta": {"tool_calls": calls},
                            "logprobs": None,
                            "finish_reason": "tool_calls",
                        }
                    else:
                        choice = {
                            "index": ci,
                            "delta": {"content": piece},
                            "logprobs": None,
                            "finish_reason": finish,
                        }
                else:
                    choice = {
                        "index": pi * n + ci,
                        "text": piece,
                        "logprobs": None,
                        "finish_reason": finish,
                        "stop_reason": None,
                    }
                    if ids and pi * n + ci not in opened:
                        opened.add(pi * n + ci)
                        choice["prompt_token_ids"] = r.prompt
                if ids:
                    choice["token_ids"] = [tok]
                out.append(chunk([choice]))
        if out:
            await resp.write(b"".join(out))
        if all(r.done for r in reqs) and not any(r.output for r in reqs):
            break
    if parsed.include_usage:
        await resp.write(chunk([], usage=usage(reqs)))
    await resp.write(DONE)
    await resp.write_eof()
    return resp
