"""``infera-run up`` settings: one field per flag, each with an ``INFERA_*`` env var."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from infera_core.settings import InferaSettings


class UpSettings(InferaSettings):
    """The embedded single-machine stack."""

    workers: int = Field(4, ge=0, description="Number of engine workers to start (0: server only).")
    engine: str = Field("sim", description="Engine of every worker (see `infera-run engines`).")
    model: str = Field("sim-model", description="Served model name (what clients send as `model`).")
    model_path: str | None = Field(None, description="Weights path or hub id [default: --model].")
    policy: str | None = Field(
        None,
        description="Routing preset (see `infera-run policies`) [default: kv-aware if installed, else round-robin].",
        json_schema_extra={"flag": "--policy"},
    )
    router_config: Path | None = Field(None, description="YAML routing profile instead of --policy.")
    host: str = Field("127.0.0.1", description="Address the server listens on.")
    port: int = Field(8000, ge=0, le=65535, description="Server port (0: a free port).")
    etcd_endpoint: str | None = Field(
        None, description="Use this etcd (host:port[,…]) instead of the embedded in-memory discovery."
    )
    ready_timeout: float = Field(120.0, gt=0, description="Seconds to wait for every worker to serve.")
    drain_timeout: float = Field(
        10.0, ge=0, description="Seconds workers wait for in-flight requests on stop."
    )
    quiet: bool = Field(False, description="No live status line (the ready line is still printed).")
    engine_logs: bool = Field(False, description="Echo the engines' own output (prefixed per worker).")
    status_interval: float = Field(1.0, gt=0, description="Seconds between live status refreshes.")
    demo: bool = Field(
        False, description="Send a short shared-prefix workload and show kv-aware vs round-robin hit rates."
    )
