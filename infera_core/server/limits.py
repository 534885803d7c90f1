"""Connection and request limits of the server (one pydantic field per flag / ``INFERA_*`` var / key).

Shared by ``infera-run serve`` (:class:`~infera_core.server.settings.ServeSettings`) and
``infera-run up`` (:class:`~infera_core.up.settings.UpSettings`), which passes them on to
its embedded server with :meth:`LimitSettings.limits_of`. What each limit does to a client
is in ``docs/how-to/operate.md`` (section "Limits").
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class LimitSettings(BaseModel):
    """Defaults safe for a server reachable from the internet; all configurable."""

    header_timeout: float = Field(
        10.0,
        gt=0,
        description="Seconds a client has to send a request's complete headers once it started"
        " (slow clients get 408 and the connection is closed).",
    )
    body_timeout: float = Field(
        30.0,
        gt=0,
        description="Seconds a client may leave between two reads of a request's body once its headers"
        " arrived (like nginx's client_body_timeout; a body that stalls gets 408, nothing is routed).",
    )
    min_body_rate: float = Field(
        1024.0,
        ge=0,
        description="Bytes per second a request body must average once --body-timeout has passed since its"
        " headers (a body trickled slower gets 408; 0: no minimum).",
    )
    idle_timeout: float = Field(
        60.0,
        gt=0,
        description="Seconds a connection may stay idle, whether used before or never used, before it is closed.",
    )
    max_connections: int = Field(
        8192, ge=1, description="Most open client connections; beyond it new ones get 503 and are closed."
    )
    max_connections_per_client: int = Field(
        0,
        ge=0,
        description="Most open connections from one client address (0: half of --max-connections);"
        " beyond it new ones from that address get 503 and are closed while other clients are served."
        " Behind a load balancer every client shares its address: raise it up to --max-connections.",
    )
    max_header_bytes: int = Field(
        64 * 1024, ge=1024, description="Largest request line + headers in bytes (beyond it: 431)."
    )
    max_body_bytes: int = Field(
        32 * 1024 * 1024, gt=0, description="Largest accepted request body in bytes (beyond it: 413)."
    )
    max_json_depth: int = Field(
        64, ge=2, description="Deepest nesting of arrays/objects in a JSON body (beyond it: 400)."
    )
    max_json_items: int = Field(
        262_144,
        ge=1,
        description="Most JSON items in a body, counted cheaply as its ',', '{' and '[' bytes (beyond it:"
        " 413); bounds the time and memory a body's parse costs.",
    )

    def per_client_cap(self) -> int:
        """The connection bound per client address in effect."""
        return self.max_connections_per_client or max(1, self.max_connections // 2)

    def limits_of(self) -> dict[str, Any]:
        """These fields' values (to build another settings object with the same limits)."""
        return {name: getattr(self, name) for name in LimitSettings.model_fields}
