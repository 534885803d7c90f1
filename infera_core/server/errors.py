"""OpenAI-shaped API errors: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import json
from typing import Any

ERROR_TYPES = {
    400: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class ApiError(Exception):
    """An error answered to the client as JSON with ``status``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or ERROR_TYPES.get(
            status, "invalid_request_error" if status < 500 else "server_error"
        )
        self.headers = headers or {}

    def payload(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def body(self) -> bytes:
        return json.dumps(self.payload()).encode()

    def anthropic_body(self) -> bytes:
        """The same error in Anthropic's shape (``/v1/messages``)."""
        kind = {
            400: "invalid_request_error",
            401: "authentication_error",
            403: "permission_error",
            404: "not_found_error",
            413: "request_too_large",
            429: "rate_limit_error",
            503: "overloaded_error",
        }.get(self.status, "api_error")
        return json.dumps({"type": "error", "error": {"type": kind, "message": self.message}}).encode()

    def sse_event(self) -> bytes:
        """A terminal SSE event carrying this error (mid-stream failures)."""
        return b"data: " + self.body() + b"\n\n"


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)
