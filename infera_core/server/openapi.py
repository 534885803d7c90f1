"""The OpenAPI document of the server's public routes, served at ``GET /openapi.json``.

Written by hand: the hot routes are raw ASGI (no pydantic models to generate it from) and
validate only what routing needs, so the request schemas say exactly that much — every
other field is kept and forwarded to the worker as sent. The fuzz suite
(``tests/server/test_fuzz_*.py``) runs schemathesis against this document.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
_ANTHROPIC_ERROR = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}
_FAILURES = {
    "400": "Invalid JSON, a missing or mistyped field, or JSON nested deeper than --max-json-depth.",
    "401": "An API key is required (--api-key-file) and was missing or unknown.",
    "403": "The API key may not use this model, or direct routing without the admin token.",
    "404": "Unknown model; a previous_response_id no worker holds (or whose worker is gone).",
    "408": "The request headers (--header-timeout) or body (--body-timeout) did not arrive in time.",
    "413": "The body is over --max-body-bytes, or holds more than --max-json-items items.",
    "429": "A worker or API-key budget is at its limit (Retry-After says when to retry).",
    "431": "The request line and headers are over --max-header-bytes.",
    "502": "The worker failed.",
    "503": "No worker can serve the model, or the server is at --max-connections.",
    "504": "The worker did not answer in time.",
}


def _failures(schema: dict[str, Any]) -> dict[str, Any]:
    content = {"application/json": {"schema": schema}}
    return {code: {"description": text, "content": content} for code, text in _FAILURES.items()}


def _post(summary: str, body: dict[str, Any], error: dict[str, Any]) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
            "responses": {
                "200": {
                    "description": "The worker's answer (a JSON object, or with `stream` an SSE stream).",
                    "content": {
                        "application/json": {"schema": {"type": "object"}},
                        "text/event-stream": {"schema": {}},
                    },
                },
                **_failures(error),
            },
        }
    }


_STREAM = {"type": ["boolean", "null"]}
_MODEL = {"type": "string", "minLength": 1, "example": "sim-model"}
_MESSAGE = {
    "type": "object",
    "required": ["role"],
    "properties": {"role": {"type": "string"}, "content": {}},
}
_TOKENS = {"type": "array", "items": {"type": "integer"}, "minItems": 1}
_CHAT = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {
        "model": _MODEL,
        "messages": {"type": "array", "items": _MESSAGE, "minItems": 1},
        "stream": _STREAM,
    },
}
_COMPLETION = {
    "type": "object",
    "required": ["model", "prompt"],
    "properties": {
        "model": _MODEL,
        "prompt": {
            "anyOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "string"}, "minItems": 1},
                _TOKENS,
                {"type": "array", "items": _TOKENS, "minItems": 1},
            ]
        },
        "stream": _STREAM,
    },
}
_ANTHROPIC_MESSAGE = {
    "type": "object",
    "required": ["role", "content"],
    "properties": {
        "role": {"enum": ["user", "assistant"]},
        "content": {
            "anyOf": [
                {"type": "string"},
                {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["type"],
                        "properties": {"type": {"type": "string"}},
                    },
                },
            ]
        },
    },
}
_MESSAGES = {
    "type": "object",
    "required": ["model", "messages", "max_tokens"],
    "properties": {
        "model": _MODEL,
        "messages": {"type": "array", "items": _ANTHROPIC_MESSAGE, "minItems": 1},
        "max_tokens": {"type": "integer", "minimum": 1},
        "stream": _STREAM,
    },
}
_RESPONSES = {
    "type": "object",
    "required": ["model", "input"],
    "properties": {
        "model": _MODEL,
        "input": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
        "instructions": {"type": ["string", "null"]},
        "previous_response_id": {"type": ["string", "null"], "minLength": 1},
        "stream": _STREAM,
    },
}


def openapi_document(version: str = "0") -> dict[str, Any]:
    """The document (OpenAPI 3.1) of ``/v1/chat/completions``, ``/v1/completions``,
    ``/v1/messages``, ``/v1/responses``, ``/v1/models`` and ``/health``."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Infera",
            "version": version,
            "description": "One OpenAI- and Anthropic-compatible endpoint in front of a fleet of engines.",
        },
        "paths": {
            "/v1/chat/completions": _post("OpenAI chat completion", _CHAT, _ERROR),
            "/v1/completions": _post("OpenAI (legacy) completion", _COMPLETION, _ERROR),
            "/v1/messages": _post("Anthropic Messages", _MESSAGES, _ANTHROPIC_ERROR),
            "/v1/responses": _post("OpenAI Responses (create)", _RESPONSES, _ERROR),
            "/v1/models": {
                "get": {
                    "summary": "The models the fleet serves",
                    "responses": {
                        "200": {
                            "description": "A list of models.",
                            "content": {
                                "application/json": {
                                    "schema": {
                                        "type": "object",
                                        "required": ["object", "data"],
                                        "properties": {
                                            "object": {"const": "list"},
                                            "data": {"type": "array"},
                                        },
                                    }
                                }
                            },
                        },
                        "401": _failures(_ERROR)["401"],
                    },
                }
            },
            "/health": {
                "get": {
                    "summary": "Whether any worker is active",
                    "responses": {
                        code: {
                            "description": text,
                            "content": {
                                "application/json": {
                                    "schema": {
                                        "type": "object",
                                        "required": ["status", "active_workers", "models"],
                                    }
                                }
                            },
                        }
                        for code, text in (("200", "Workers are active."), ("503", "No active worker."))
                    },
                }
            },
        },
    }


def add_openapi_route(app: FastAPI) -> None:
    """``GET /openapi.json`` on ``app`` (FastAPI's generated one is off)."""
    document = openapi_document()

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi() -> JSONResponse:
        return JSONResponse(document)
