"""Just enough validation of request bodies: a JSON object, ``model``, ``messages``/``prompt``.

Unknown fields are kept (the original bytes are what gets forwarded).
"""

from __future__ import annotations

from typing import Any

import msgspec

from infera_core.server.errors import ApiError, bad_request

_decode = msgspec.json.Decoder().decode


def parse_object(raw: bytes) -> dict[str, Any]:
    if not raw:
        raise bad_request("The request body is empty; expected a JSON object.", code="invalid_json")
    try:
        body = _decode(raw)
    except msgspec.DecodeError as exc:
        raise bad_request(f"The request body is not valid JSON: {exc}", code="invalid_json") from None
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


def _stream(body: dict[str, Any]) -> None:
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean.", "stream", "invalid_type")


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
    )
