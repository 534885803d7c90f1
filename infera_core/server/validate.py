"""Just enough validation of request bodies: a JSON object, ``model``, ``messages``/``prompt``.

Unknown fields are kept (the original bytes are what gets forwarded).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import msgspec

from infera_core.server.errors import ApiError, bad_request
from infera_core.server.surrogates import without_lone_surrogates

_decode = msgspec.json.Decoder().decode
_CHUNK = 1 << 20
"""Bodies over this many bytes are counted in chunks of it, yielding to the loop in between."""


@dataclass(frozen=True, slots=True)
class BodyLimits:
    """``--max-body-bytes``, ``--max-json-depth`` and ``--max-json-items`` of the hot routes."""

    max_bytes: int = 32 * 1024 * 1024
    max_depth: int = 64
    max_items: int = 262_144

    @classmethod
    def of(cls, settings: Any) -> BodyLimits:
        return cls(settings.max_body_bytes, settings.max_json_depth, settings.max_json_items)


_DENSE = 64
"""Occurrences of a byte found one by one before the rest of a span is counted instead."""


def occurrences(data: bytes, byte: bytes, start: int = 0, end: int | None = None) -> int:
    """How many times the one-byte ``byte`` occurs in ``data[start:end]`` (no copy).

    ``bytes.count`` of one byte walks the span a byte at a time (~60 ms for 31 MB), while
    ``find`` jumps with ``memchr`` (~10× faster): a body that is mostly long strings holds
    few ``,`` ``{`` ``[`` bytes, so they are found; where they are dense (a body of many
    small values) the rest of the span is counted.
    """
    if end is None:
        end = len(data)
    n = 0
    i = data.find(byte, start, end)
    while i >= 0:
        n += 1
        if n == _DENSE:
            return n + data.count(byte, i + 1, end)
        i = data.find(byte, i + 1, end)
    return n


def _count(raw: bytes, start: int, end: int) -> tuple[int, int]:
    """(``,`` count, ``{`` + ``[`` count) of ``raw[start:end]`` without copying it."""
    containers = occurrences(raw, b"{", start, end) + occurrences(raw, b"[", start, end)
    return occurrences(raw, b",", start, end), containers


async def parse_body(raw: bytes, limits: BodyLimits, counted: bool = False) -> dict[str, Any]:
    """The body as a JSON object, within ``limits``; :class:`ApiError` (400/413) otherwise.

    ``counted``: the body's items were already counted against ``max_items`` as it was read
    (:func:`~infera_core.server.asgi.read_body` with ``max_items``): it is not counted again
    (each count of a 31 MB body costs the event loop ~60 ms a byte value), only its depth
    checked by walking what was parsed (at most ``max_items`` values).

    Before building any object the body's items are counted at C speed (``,``, ``{`` and
    ``[`` bytes, strings included: an upper bound), so a body of millions of tiny values is
    refused for about 1 ms per MB instead of costing seconds and ~20× its size in memory;
    a large body is counted in 1 MB steps with the event loop free in between. What is
    parsed is then at most ``max_items`` values: a bounded, short decode. (A thread would
    not help: the decoder holds the GIL.)
    """
    n = len(raw)
    if n <= limits.max_items:
        return parse_short_body(raw, limits)
    if counted:
        body = parse_object(raw, limits.max_depth)
        if _too_deep(body, limits.max_depth):
            raise too_deep(limits.max_depth)
        return body
    commas = containers = 0
    for start in range(0, n, _CHUNK):
        c, k = _count(raw, start, start + _CHUNK)
        commas += c
        containers += k
        if commas + containers > limits.max_items:
            raise too_many_items(limits.max_items)
        if n > _CHUNK:
            await asyncio.sleep(0)
    body = parse_object(raw, limits.max_depth)
    if containers > limits.max_depth and _too_deep(body, limits.max_depth):
        raise too_deep(limits.max_depth)
    return body


def parse_short_body(raw: bytes, limits: BodyLimits) -> dict[str, Any]:
    """:func:`parse_body` for a body of at most ``max_items`` bytes, without a coroutine
    (every item takes a byte: a body this short cannot hold too many)."""
    body = parse_object(raw, limits.max_depth)
    depth = limits.max_depth
    # nesting n deep takes 2n bytes ("[" and "]"): a shorter body cannot be too deep
    if len(raw) > 2 * depth and raw.count(b"{") + raw.count(b"[") > depth and _too_deep(body, depth):
        raise too_deep(depth)
    return body


def _too_deep(body: object, limit: int) -> bool:
    """Whether arrays/objects nest more than ``limit`` deep (iterative: no recursion)."""
    stack: list[tuple[object, int]] = [(body, 1)]
    while stack:
        obj, depth = stack.pop()
        if depth > limit:
            return True
        for value in obj.values() if isinstance(obj, dict) else obj:  # type: ignore[attr-defined]
            if isinstance(value, (dict, list)):
                stack.append((value, depth + 1))
    return False


def json_items(chunk: bytes) -> int:
    """An upper bound of the JSON values that start in ``chunk`` (its ``,`` ``{`` ``[`` bytes)."""
    return occurrences(chunk, b",") + occurrences(chunk, b"{") + occurrences(chunk, b"[")


def too_many_items(limit: int) -> ApiError:
    return ApiError(
        413,
        f"The request body holds more than {limit} JSON items (--max-json-items).",
        code="too_many_json_items",
    )


def too_deep(limit: int) -> ApiError:
    return bad_request(
        f"The request body nests arrays/objects deeper than the server's limit of {limit} (--max-json-depth).",
        code="json_too_deep",
    )


def parse_object(raw: bytes, max_depth: int = 64) -> dict[str, Any]:
    if not raw:
        raise bad_request("The request body is empty; expected a JSON object.", code="invalid_json")
    try:
        body = _decode(raw)
    except msgspec.DecodeError as exc:
        lone = without_lone_surrogates(raw)
        if lone is not None:  # the caller may forward lone.repaired instead
            raise lone from None
        raise bad_request(f"The request body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:  # nested far deeper than any limit
        raise too_deep(max_depth) from None
    if not isinstance(body, dict):
        raise bad_request(
            f"The request body must be a JSON object, got {type(body).__name__}.", code="invalid_type"
        )
    return body


def _model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if model is None:
        raise bad_request("Missing required parameter: 'model'.", "model", "missing_required_parameter")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' must be a non-empty string.", "model", "invalid_type")
    return model


def check_model(body: dict[str, Any]) -> str:
    """The request's ``model`` (a 400 when missing or not a non-empty string)."""
    return _model(body)


MAX_CHOICES = 128
"""The most choices one request may ask for (``n``, ``best_of``), as OpenAI's API allows: a
larger fan-out is refused here rather than forwarded (an engine asked for 10^23 choices can
wedge, and the router's hang detection would carry the same body to the next worker)."""


def _stream(body: dict[str, Any]) -> None:
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean.", "stream", "invalid_type")
    if "n" not in body and "best_of" not in body:
        return  # the usual request: no fan-out asked for
    for field in ("n", "best_of"):
        value = body.get(field)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_CHOICES:
            raise bad_request(
                f"'{field}' must be an integer from 1 to {MAX_CHOICES}.", field, "invalid_value"
            )


def check_chat(body: dict[str, Any]) -> str:
    """Validate a chat completion request; returns the model."""
    model = _model(body)
    messages = body.get("messages")
    if messages is None:
        raise bad_request("Missing required parameter: 'messages'.", "messages", "missing_required_parameter")
    if not isinstance(messages, list) or not messages:
        raise bad_request(
            "'messages' must be a non-empty array of message objects.", "messages", "invalid_type"
        )
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad_request(
                f"'messages[{i}]' must be an object with a string 'role'.", f"messages[{i}]", "invalid_type"
            )
    _stream(body)
    return model


def _is_token_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in v)


def check_completion(body: dict[str, Any]) -> str:
    """Validate a (legacy) completion request; returns the model."""
    model = _model(body)
    prompt = body.get("prompt")
    if prompt is None:
        raise bad_request("Missing required parameter: 'prompt'.", "prompt", "missing_required_parameter")
    ok = (
        isinstance(prompt, str)
        or (isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt))
        or (_is_token_list(prompt) and prompt)
        or (isinstance(prompt, list) and prompt and all(_is_token_list(p) and p for p in prompt))
    )
    if not ok:
        raise bad_request(
            "'prompt' must be a string, an array of strings, an array of token ids, or an array of such arrays.",
            "prompt",
            "invalid_type",
        )
    _stream(body)
    return model


def check_messages(body: dict[str, Any]) -> str:
    """Validate an Anthropic Messages request; returns the model."""
    model = _model(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty array.", "messages", "invalid_type")
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        raise bad_request(
            "Missing required parameter: 'max_tokens'.", "max_tokens", "missing_required_parameter"
        )
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise bad_request("'max_tokens' must be a positive integer.", "max_tokens", "invalid_type")
    _stream(body)
    return model


def too_large(limit: int) -> ApiError:
    return ApiError(
        413,
        f"The request body is larger than the server's limit of {limit} bytes (--max-body-bytes).",
        code="request_too_large",
        headers={"connection": "close"},  # the rest of the body is not read
    )
