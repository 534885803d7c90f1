"""Settings of ``infera-run serve`` (flags, ``INFERA_*`` env, ``--config`` file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from infera_core.config.settings import InferaSettings
from infera_core.kv.settings import KvSettings
from infera_core.server.auth_settings import AuthSettings
from infera_core.server.fault_settings import FaultSettings
from infera_core.server.limits import LimitSettings
from infera_core.server.observe_settings import ObserveSettings


def router_host(description: str) -> Any:
    """The router's listen address (``--host``, ``INFERA_ROUTER_HOST``): serve's and up's."""
    return Field(
        "127.0.0.1",
        description=description,
        json_schema_extra={"env": "INFERA_ROUTER_HOST", "old_env": ["INFERA_HOST"]},
    )


def router_port(description: str) -> Any:
    """The router's port (``--port``, ``INFERA_ROUTER_PORT``): serve's and up's."""
    return Field(
        8000,
        ge=0,
        le=65535,
        description=description,
        json_schema_extra={"env": "INFERA_ROUTER_PORT", "old_env": ["INFERA_PORT"]},
    )


class ServeSettings(InferaSettings, KvSettings, AuthSettings, LimitSettings, FaultSettings, ObserveSettings):
    """Everything the server reads at start-up (KV-routing fields from :class:`KvSettings`,
    connection and request limits from :class:`LimitSettings`)."""

    host: str = router_host("Address to listen on.")
    port: int = router_port("Port to listen on.")
    processes: int = Field(
        0,
        ge=0,
        description="Server processes sharing the port (SO_REUSEPORT), each with the fleet view and"
        " the KV index, metrics summed over all of them; 0: one per CPU core; 1: a single process.",
    )
    discovery: str = Field(
        "etcd",
        description="Discovery backend: etcd, nats, memory, static… (see `infera-run plugins`).",
        json_schema_extra={"flag": "--discovery-backend", "aliases": ["--discovery"]},
    )
    request_transport: str = Field(
        "http",
        description="Request transport started with the server (http, nats…); each worker is reached "
        "by the transport its record names, so one server serves a mixed fleet.",
    )
    kv_event_transport: str = Field(
        "zmq",
        description="KV-event transport started with the server (zmq, nats…); each worker's events "
        "come through the transport its record names.",
    )
    etcd_endpoint: list[str] = Field(
        ["127.0.0.1:2379"],
        description="etcd endpoint host:port (repeatable).",
        json_schema_extra={"flag": "--etcd-endpoint"},
    )
    static_file: str | None = Field(None, description="Worker list file for --discovery-backend static.")
    discovery_prefix: str = Field(
        "/infera/workers/",
        description="Key prefix of worker records.",
        json_schema_extra={"aliases": ["--etcd-prefix"]},
    )
    router_policy: str | None = Field(
        None,
        description="Named routing preset (see `infera-run policies`)"
        " [default: kv-aware if installed, else round-robin].",
    )
    router_config: Path | None = Field(
        None, description="YAML routing profile (filters/scorers/picker, per-model overrides)."
    )
    router_mode: Literal["policy", "direct"] = Field(
        "policy", description="direct: honour the x-worker-instance-id header, else use the policy."
    )
    request_max_retries: int = Field(
        1, ge=0, description="Retries on another worker when a request fails before its first byte."
    )
    connect_timeout: float = Field(5.0, gt=0, description="Seconds to connect to a worker.")
    first_byte_timeout: float = Field(
        600.0, gt=0, description="Seconds to wait for a worker's response headers."
    )
    stream_idle_timeout: float = Field(
        300.0, gt=0, description="Seconds without a byte from a worker before a response is abandoned."
    )
    max_inflight_per_worker: int = Field(
        0, ge=0, description="Admission cap per worker (0: none); beyond it → 429 with Retry-After."
    )
    breaker_failures: int = Field(
        3, ge=1, description="Consecutive failures (connect error, 5xx) that open a worker's breaker."
    )
    breaker_cooldown: float = Field(
        5.0, gt=0, description="Seconds an open breaker waits before a half-open probe."
    )
    http_client: Literal["native", "aiohttp"] = Field(
        "native",
        description="HTTP client for the hop to workers: native (asyncio + httptools, leaner) or aiohttp"
        " (pip install 'infera-core[aiohttp]').",
        json_schema_extra={
            "aliases": ["--upstream-transport"],
            "old_env": ["INFERA_UPSTREAM_TRANSPORT"],
            "old_keys": ["upstream_transport"],
        },
    )
    upstream_connections: int = Field(
        4096, ge=1, description="Most concurrent connections to workers (all together)."
    )
