"""``infera-run up`` settings: one field per flag, each with an ``INFERA_*`` env var."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from infera_core.config.settings import InferaSettings
from infera_core.engines.settings import RestartPolicy
from infera_core.server.auth_settings import AuthSettings
from infera_core.server.fault_settings import FaultSettings
from infera_core.server.limits import LimitSettings
from infera_core.server.observe_settings import ObserveSettings
from infera_core.server.settings import router_host, router_port
from infera_core.tokenize.settings import TokenizeSettings


class UpSettings(
    InferaSettings, LimitSettings, AuthSettings, FaultSettings, TokenizeSettings, ObserveSettings
):
    """The embedded single-machine stack (its server's connection and request limits from
    :class:`LimitSettings`, its routing tokenizer's bounds from :class:`TokenizeSettings`)."""

    workers: int = Field(4, ge=0, description="Number of engine workers to start (0: server only).")
    engine: str = Field("sim", description="Engine of every worker (see `infera-run engines`).")
    prefill: int = Field(0, ge=0, description="Prefill workers to start (PD disaggregation, with --decode).")
    decode: int = Field(0, ge=0, description="Decode workers to start (PD disaggregation, with --prefill).")
    pd_protocol: str | None = Field(
        None,
        description="PD protocol of the prefill/decode workers, an engine option [default: the engine's].",
    )
    model: str = Field("sim-model", description="Served model name (what clients send as `model`).")
    model_path: str | None = Field(None, description="Weights path or hub id [default: --model].")
    policy: str | None = Field(
        None,
        description="Routing preset (see `infera-run policies`)"
        " [default: the engine's (approximate-prefix for engines without KV events), else kv-aware"
        " if installed, else round-robin].",
        json_schema_extra={
            "flag": "--router-policy",
            "aliases": ["--policy"],
            "env": "INFERA_ROUTER_POLICY",
            "old_env": ["INFERA_POLICY"],
        },
    )
    router_config: Path | None = Field(None, description="YAML routing profile instead of --router-policy.")
    engine_python: str | None = Field(
        None,
        description="Interpreter of the engine's own venv (every worker's, as `worker --engine-python`).",
    )
    tokenizer: list[str] = Field(
        default=[],
        description="Routing tokenizer: PATH (an hf model dir, for --model), or MODEL=NAME[:PATH] as for "
        "serve (repeatable).",
    )
    kv_block_size: list[str] = Field(
        default=[],
        description="Expected KV block size: N (for --model) or MODEL=N (repeatable); disagreeing workers "
        "are flagged.",
    )
    labels: str | None = Field(None, description="Labels of every worker, key=value[,key=value…].")
    host: str = router_host("Address the server listens on.")
    port: int = router_port("Server port (0: a free port).")
    etcd_endpoint: str | None = Field(
        None, description="Use this etcd (host:port[,…]) instead of the embedded in-memory discovery."
    )
    discovery: str | None = Field(
        None,
        description="Discovery backend: memory (embedded), etcd, nats… "
        "[default: etcd with --etcd-endpoint, else memory].",
        json_schema_extra={"flag": "--discovery-backend", "aliases": ["--discovery"]},
    )
    request_transport: str = Field(
        "http", description="How the server reaches the workers: http, or an installed transport (nats)."
    )
    kv_event_transport: str = Field(
        "zmq",
        description="How the workers' KV events reach the server: zmq, or an installed transport (nats).",
    )
    ready_timeout: float = Field(120.0, gt=0, description="Seconds to wait for every worker to serve.")
    drain_timeout: float = Field(
        10.0, ge=0, description="Seconds workers wait for in-flight requests on stop."
    )
    restart_engine: RestartPolicy = Field(
        RestartPolicy.ON_FAILURE,
        description="on-failure: restart a worker's engine when it dies (the others keep serving); "
        "never: a dead worker stays down.",
    )
    max_restarts: int = Field(5, ge=1, description="Restarts of one engine in a row before it stays down.")
    quiet: bool = Field(False, description="No live status line (the ready line is still printed).")
    engine_logs: bool = Field(False, description="Echo the engines' own output (prefixed per worker).")
    status_interval: float = Field(1.0, gt=0, description="Seconds between live status refreshes.")
    demo: bool = Field(
        False, description="Send a short shared-prefix workload and show kv-aware vs round-robin hit rates."
    )

    def tokenizer_specs(self) -> list[str]:
        """``--tokenizer`` as serve takes it: a bare PATH (or ``NAME:PATH``) is --model's."""
        return [_for_model(self.model, v, "hf:") for v in self.tokenizer]

    def block_size_specs(self) -> list[str]:
        """``--kv-block-size`` as serve takes it: a bare N is --model's."""
        return [_for_model(self.model, v, "") for v in self.kv_block_size]

    def discovery_name(self) -> str:
        """The discovery backend: ``--discovery-backend``, else etcd with ``--etcd-endpoint``, else memory."""
        return self.discovery or ("etcd" if self.etcd_endpoint else "memory")

    def plane_lines(self, embedded_nats: bool = False) -> list[str]:
        """What ``up`` prints at start: the plane, its three axes and where each service is."""
        axes = (self.discovery_name(), self.request_transport, self.kv_event_transport)
        plane = "NATS" if "nats" in axes else axes[0]
        lines = [f"Plane: {plane} (discovery {axes[0]}, requests {axes[1]}, KV events {axes[2]})"]
        if axes[0] == "etcd":
            lines.append(f"etcd: {self.etcd_endpoint or '127.0.0.1:2379'}")
        nats_url = getattr(self, "nats_url", None)  # the infera-nats plugin's setting
        if "nats" in axes and nats_url:
            lines.append(f"NATS: {nats_url}" + (" (started by up)" if embedded_nats else ""))
        return lines

    def roles(self) -> list[str]:
        """The role of each worker to start: ``--workers`` mixed ones (none by default when
        ``--prefill``/``--decode`` are given), then the prefill and decode ones."""
        pd = self.prefill + self.decode
        mixed = self.workers if "workers" in self.model_fields_set or not pd else 0
        return ["mixed"] * mixed + ["prefill"] * self.prefill + ["decode"] * self.decode

    def fleet(self) -> str:
        """``4 sim workers`` or ``2 prefill + 2 decode sim workers`` (messages)."""
        roles = self.roles()
        parts = [f"{roles.count(r)} {r}" for r in ("prefill", "decode") if r in roles]
        if not parts:
            return f"{len(roles)} {self.engine} workers"
        mixed = roles.count("mixed")
        return " + ".join(([f"{mixed} mixed"] if mixed else []) + parts) + f" {self.engine} workers"


def _for_model(model: str, value: str, kind: str) -> str:
    """``MODEL=…`` as given; else ``model=`` + the value (``kind`` before a bare path)."""
    if "=" in value:
        return value
    name, sep, _ = value.partition(":")
    named = bool(sep) and name.isidentifier()  # NAME:PATH (hf:/models/x), not a bare path
    return f"{model}={value if named or not kind else kind + value}"
