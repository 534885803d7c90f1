"""A worker's 404: the engine's own answer (an unknown model or adapter) or a sign that the
worker is not an engine at all (an HTTP service that does not serve the route).

An engine answers an unknown model with an OpenAI-shaped error (vLLM's ``ErrorResponse``,
``{"error": {"message", "type", "param", "code": 404}}``; SGLang's and older vLLM's
``{"object": "error", "message": …, "code": 404}``): that answer is the client's, passed on
as it came. Any other 404 (FastAPI's ``{"detail": "Not Found"}``, an HTML page, plain text)
means the route is not there: the worker is not an engine serving this API, which counts as
the worker's failure (its breaker), and the request is tried on another worker.
"""

from __future__ import annotations

from typing import Any

from infera_core.server.errors import ApiError
from infera_core.util.api_errors import engine_error

__all__ = ["EngineAnswer", "engine_error", "not_an_engine"]


class EngineAnswer(ApiError):
    """The engine's own error answer, sent to the client byte for byte (in Anthropic's shape
    on ``/v1/messages``)."""

    def __init__(self, status: int, data: bytes, error: dict[str, Any]) -> None:
        message = error.get("message") if isinstance(error.get("message"), str) else None
        super().__init__(status, message or str(error.get("error") or "not found"), code="upstream_error")
        self.raw = data

    def body(self) -> bytes:
        return self.raw


def not_an_engine(worker_id: str, path: str) -> ApiError:
    return ApiError(
        502,
        f"Worker {worker_id} answered 404 on {path} without an API error: it does not serve this"
        " API (not an engine?); it counts as the worker's failure.",
        code="upstream_not_an_engine",
        type="upstream_error",
    )
