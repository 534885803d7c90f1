"""Observability settings (access log, routing explanations, session affinity header), shared by
``infera-run serve`` and ``infera-run up``; what each does is in ``docs/how-to/operate.md``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from infera_core.scheduling.types import DEFAULT_SESSION_HEADERS


class ObserveSettings(BaseModel):
    """One pydantic field per flag / ``INFERA_*`` variable / config key."""

    access_log: Literal["off", "text", "json"] = Field(
        "off",
        description="One line per request on stderr (time, request id, key name, model, worker, status,"
        " TTFT, duration, tokens, retries; never a prompt or a key): off, text (key=value) or json.",
    )
    access_log_sample: float = Field(
        1.0, ge=0, le=1, description="Fraction of requests written to the access log (0..1)."
    )
    decisions_kept: int = Field(
        100, ge=0, description="Routing decisions kept for GET /v1/admin/decisions and the dashboard."
    )
    decisions_sample: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Fraction of all requests whose routing decision is recorded for /v1/admin/decisions"
        " (requests sent with X-Infera-Explain are always recorded).",
    )
    session_header: list[str] = Field(
        list(DEFAULT_SESSION_HEADERS),
        description="Request headers naming a conversation for session affinity (repeatable; the first"
        " present wins; without one the body's 'user' or 'metadata.user_id' is used).",
    )

    otlp_traces_endpoint: str | None = Field(
        None,
        description="OTLP/HTTP collector for OpenTelemetry traces, e.g. http://127.0.0.1:4318 (unset: the"
        " OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT variables, else no tracing)."
        " Needs pip install 'infera-core[tracing]'.",
    )
    otlp_traces_sample: float = Field(
        1.0,
        ge=0,
        le=1,
        description="Fraction of requests traced (a client's sampled traceparent is followed).",
    )

    def observe_of(self) -> dict[str, Any]:
        """These fields as keyword arguments (``up`` hands them to its server's settings)."""
        return {name: getattr(self, name) for name in ObserveSettings.model_fields}
