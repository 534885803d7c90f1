"""Recognise an engine's OpenAI-shaped error answer (shared by the router and the launcher)."""

from __future__ import annotations

from typing import Any

import msgspec


def engine_error(data: bytes) -> dict[str, Any] | None:
    """The error object when ``data`` is an OpenAI-shaped error, else None: vLLM's
    ``{"error": {"message", "type", "param", "code"}}``, SGLang's (and older vLLM's)
    ``{"object": "error", "message": …}``, or ``{"error": "…"}``. FastAPI's
    ``{"detail": "Not Found"}``, an HTML page or plain text are not."""
    try:
        obj = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return None
    if not isinstance(obj, dict):
        return None
    inner = obj.get("error")
    if isinstance(inner, dict):
        return inner
    if obj.get("object") == "error" or isinstance(inner, str):
        return obj
    return None
