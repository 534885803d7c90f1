"""``infera-run worker`` settings: one field per flag, each with an ``INFERA_*`` env var."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from infera_core.config.settings import InferaSettings
from infera_core.discovery.base import (
    DiscoverySettings,
    discovery_prefix_field,
    discovery_timeout_field,
    etcd_endpoint_field,
)
from infera_core.errors import ConfigError
from infera_core.worker import Role


class RestartPolicy(StrEnum):
    """What the launcher does when its engine dies after it has served."""

    NEVER = "never"
    ON_FAILURE = "on-failure"


class WorkerSettings(InferaSettings):
    """Infera's own worker flags, the same for every engine."""

    model: str | None = Field(None, description="Served model name (what clients send as `model`).")
    model_path: str | None = Field(None, description="Weights path or hub id [default: --model].")
    role: Role = Field(Role.MIXED, description="Worker role in prefill/decode disaggregation.")
    worker_id: str | None = Field(
        None, description="Unique id in the fleet [default: <engine>-<host>-<port>]."
    )
    host: str = Field(
        "127.0.0.1",
        description="Address the engine binds to.",
        json_schema_extra={"env": "INFERA_ENGINE_HOST", "old_env": ["INFERA_HOST"]},
    )
    port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="Engine port [default: a free port].",
        json_schema_extra={"env": "INFERA_ENGINE_PORT", "old_env": ["INFERA_PORT"]},
    )
    advertise_host: str | None = Field(
        None,
        description="Address others use to reach this worker "
        "[default: 127.0.0.1 for a loopback --host, else this machine's primary IP].",
    )
    discovery: str | None = Field(
        None,
        description="Discovery backend: etcd, nats, memory, static… "
        "[default: etcd when --etcd-endpoint is set].",
        json_schema_extra={"flag": "--discovery-backend", "aliases": ["--discovery"]},
    )
    request_transport: str = Field(
        "http",
        description="How routers reach this worker: http (the engine's server) or an installed "
        "transport such as nats (the launcher runs its responder).",
    )
    kv_event_transport: str = Field(
        "zmq",
        description="How routers get this worker's KV events: zmq (the engine's publisher) or an "
        "installed transport such as nats (the launcher relays the events).",
    )
    etcd_endpoint: str | None = etcd_endpoint_field()
    discovery_prefix: str = discovery_prefix_field()
    static_file: str | None = Field(None, description="Worker list file of --discovery static.")
    lease_ttl: float = Field(
        10.0, gt=0, description="Registration lease TTL in seconds (heartbeat every TTL/3)."
    )
    discovery_timeout: float = discovery_timeout_field(
        "Seconds to wait for the discovery backend at start-up (serve's --connect-timeout is to a worker)."
    )
    ready_timeout: float = Field(600.0, gt=0, description="Seconds to wait for the engine to serve.")
    drain_timeout: float = Field(30.0, ge=0, description="Seconds to wait for in-flight requests on SIGTERM.")
    stop_timeout: float = Field(
        10.0, ge=0, description="Seconds between SIGTERM and SIGKILL when stopping the engine."
    )
    health_interval: float = Field(2.0, gt=0, description="Seconds between engine health checks.")
    health_failures: int = Field(
        3, ge=1, description="Consecutive failed health checks that count as a dead engine."
    )
    restart_engine: RestartPolicy = Field(
        RestartPolicy.NEVER,
        description="on-failure: restart an engine that died after it served (with backoff, "
        "deregistered while down); never: the launcher exits non-zero.",
    )
    max_restarts: int = Field(
        5, ge=1, description="Restarts in a row before giving up (the count resets after 60 s of serving)."
    )
    restart_backoff: float = Field(
        1.0, gt=0, description="Seconds before the first restart; doubles per restart in a row, up to 30."
    )
    health_generate_interval: float = Field(
        5.0,
        ge=0,
        description="Seconds between one-token generation checks (0: off); a worker failing them "
        "is published as draining until one succeeds.",
    )
    health_generate_timeout: float = Field(
        10.0, gt=0, description="Seconds a one-token generation check may take before it counts as failed."
    )
    health_generate_failures: int = Field(
        2, ge=1, description="Failed generation checks in a row that take the worker out of rotation."
    )
    engine_python: str | None = Field(None, description="Interpreter of the engine's own venv.")
    labels: str | None = Field(None, description="Worker labels, key=value[,key=value…].")

    def discovery_name(self) -> str:
        if self.discovery:
            return self.discovery
        if self.etcd_endpoint:
            return "etcd"
        raise ConfigError(
            "no discovery backend: pass --etcd-endpoint HOST:PORT (env INFERA_ETCD_ENDPOINT) "
            "or --discovery-backend etcd|nats|memory (env INFERA_DISCOVERY)"
        )

    def discovery_settings(self) -> DiscoverySettings:
        return DiscoverySettings.of(self)

    def label_map(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for item in (self.labels or "").split(","):
            if not item.strip():
                continue
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ConfigError(f"--labels (env INFERA_LABELS): expected key=value, got {item.strip()!r}")
            out[key.strip()] = value.strip()
        return out
