"""Send one streamed request and time it: TTFT, inter-token gaps, end-to-end.

Streaming is always on (``stream: true`` with ``stream_options.include_usage``);
every SSE ``data:`` chunk that carries generated text (or a token) counts as one
output token unless the final usage says otherwise.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import aiohttp
import msgspec

_WORKER_HEADERS = ("x-infera-worker", "x-worker-instance-id", "x-worker-id")


class RequestResult:
    """Timings and counts of one request (seconds; ``start`` from the bench start)."""

    __slots__ = (
        "cached_tokens",
        "e2e",
        "error",
        "group",
        "itls",
        "output_tokens",
        "prompt_tokens",
        "start",
        "text",
        "ttft",
        "worker",
    )

    def __init__(self, start: float) -> None:
        self.start = start
        self.ttft: float | None = None
        self.e2e: float | None = None
        self.itls: list[float] = []
        self.output_tokens = 0
        self.prompt_tokens: int | None = None
        self.cached_tokens: int | None = None
        self.error: str | None = None
        self.worker: str | None = None
        self.text = ""
        self.group: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__ if k != "text"}


def build_body(
    api: str,
    model: str,
    prompt: str | list[int] | list[dict[str, str]],
    max_tokens: int,
    ignore_eos: bool,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
    }
    if api == "chat":
        body["messages"] = prompt
    else:
        body["prompt"] = prompt
    if ignore_eos:
        body["ignore_eos"] = True
    if extra:
        body.update(extra)
    return body


def _chunk_text(chunk: dict[str, Any]) -> str | None:
    """Text of a streamed chunk (chat delta or completion text); None when it has none."""
    choices = chunk.get("choices") or []
    if not choices:
        return None
    c = choices[0]
    delta = c.get("delta")
    if isinstance(delta, dict):
        content = delta.get("content")
        if content is None and delta.get("reasoning_content") is not None:
            return str(delta["reasoning_content"])
        return None if content is None else str(content)
    text = c.get("text")
    return None if text is None else str(text)


async def send(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    t0: float,
    limit_s: float,
    keep_text: bool = False,
    headers: Mapping[str, str] | None = None,
) -> RequestResult:
    """POST ``body`` to ``url`` (streaming) and return its timings; never raises."""
    start = time.perf_counter()
    res = RequestResult(start - t0)
    decoder = msgspec.json.Decoder()
    last: float | None = None
    parts: list[str] = []
    usage_out: int | None = None
    done_at: float | None = None
    try:
        async with asyncio.timeout(limit_s):
            async with session.post(url, json=body, headers=headers) as resp:
                for h in _WORKER_HEADERS:
                    if h in resp.headers:
                        res.worker = resp.headers[h]
                        break
                if resp.status != 200:
                    res.error = f"http_{resp.status}"
                    await resp.read()
                    return res
                async for raw in resp.content:
                    if not raw.startswith(b"data:"):
                        continue
                    data = raw[5:].strip()
                    if data == b"[DONE]":
                        # the request ends here; reading on to the stream's end (its last
                        # chunk follows at once) keeps the connection for the next request
                        done_at = time.perf_counter()
                        continue
                    now = time.perf_counter()
                    try:
                        chunk = decoder.decode(data)
                    except msgspec.DecodeError:
                        res.error = "bad_chunk"
                        return res
                    if not isinstance(chunk, dict):
                        continue
                    if "error" in chunk:
                        res.error = "stream_error"
                        return res
                    usage = chunk.get("usage")
                    if isinstance(usage, dict):
                        usage_out = usage.get("completion_tokens")
                        res.prompt_tokens = usage.get("prompt_tokens")
                        details = usage.get("prompt_tokens_details") or {}
                        if isinstance(details, dict) and details.get("cached_tokens") is not None:
                            res.cached_tokens = int(details["cached_tokens"])
                    text = _chunk_text(chunk)
                    if text is None:
                        continue
                    if last is None:
                        res.ttft = now - start
                    else:
                        res.itls.append(now - last)
                    last = now
                    res.output_tokens += 1
                    if keep_text:
                        parts.append(text)
    except TimeoutError:
        res.error = "timeout"
        return res
    except aiohttp.ClientConnectorError:
        res.error = "connect"
        return res
    except (aiohttp.ClientError, ConnectionError):
        res.error = "connection_lost"
        return res
    except ValueError:
        res.error = "bad_stream"
        return res
    res.e2e = (done_at or time.perf_counter()) - start
    if res.ttft is None:
        res.error = "no_tokens"
    if usage_out is not None:
        res.output_tokens = int(usage_out)
    res.text = "".join(parts)
    return res
