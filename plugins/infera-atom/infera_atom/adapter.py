"""The ATOM engine adapter: ``infera-run worker atom [infera flags] -- [atom flags]``.

Builds ``<python> -m atom.entrypoints.openai_server --model <path> --server-port <port> -tp N``
(ATOM's ``--port`` is its internal engine port, so the HTTP port is ``--server-port``), with
the Mooncake KV transfer config for PD roles. ATOM workers register only with etcd
discovery. Never imports ATOM.
"""

from __future__ import annotations

from collections.abc import Mapping

from infera_atom.kv_events import engine_port_flags, kv_events_info, launch_env
from infera_atom.parallel import dp_size
from infera_atom.transfer import transfer_plan
from infera_core.engines.base import (
    EngineOption,
    FlagAlias,
    LaunchContext,
    LaunchSpec,
    RecordFields,
    RunningEngine,
)
from infera_core.engines.support import AdapterBase, locate_engine, metrics_sum
from infera_core.errors import EngineError

SERVER_MODULE = "atom.entrypoints.openai_server"
REQUIRED_DISCOVERY = "etcd"
IN_FLIGHT_METRICS = ("atom:requests_running", "atom:requests_waiting", "atom:requests_parked_kv_load")
"""ATOM's ``/metrics`` gauges of requests in the engine, summed across its DP ranks
(``atom/entrypoints/openai/metrics.py``): running, waiting, and parked for an external KV load
(a PD decode waiting for its KV); their sum is the drain's in-flight count."""
SNAPSHOT_METRIC = "atom:metrics_snapshot_available"
"""1 once ATOM's exporter holds an engine snapshot; before that the gauges above read 0
whatever runs, so 0 there means "unknown"."""

MANAGED_FLAGS = {
    "--model": "--model-path",
    "--served-model-name": "infera's --model",
    "--host": "infera's --host",
    "--server-port": "infera's --port",
    "--tensor-parallel-size": "--tp",
    "-tp": "--tp",
    "--block-size": "--block-size",
    "--kv-transfer-config": "--kv-transfer-config",
}

ALIASES: Mapping[str, FlagAlias] = {
    "--server-port": FlagAlias("--port"),
    "--tensor-parallel-size": FlagAlias("--tp"),
    "-tp": FlagAlias("--tp"),
    "--block-size": FlagAlias("--block-size"),
    "--kv-transfer-config": FlagAlias("--kv-transfer-config"),
    "--enable-kv-events": FlagAlias("", takes_value=False),
}
"""ATOM's spellings of what Infera manages (``python -m infera.engine.atom``, or after ``--``)."""

OPTIONS: tuple[EngineOption, ...] = (
    EngineOption("tp", int, 1, "Tensor-parallel size (ATOM -tp)."),
    EngineOption("block_size", int, 16, "KV cache block size (ATOM --block-size)."),
    EngineOption(
        "handshake_port",
        int,
        0,
        "First Mooncake handshake port for --role prefill/decode; TP rank r uses this + r (ATOM's "
        "side-channel layout). 0: pick --tp consecutive free ones. Advertised in the record.",
    ),
    EngineOption(
        "pd_connector",
        str,
        "mooncake",
        "KV connector for --role prefill/decode: mooncake, moriio (MoRI-IO), multi (from "
        "--kv-transfer-config), or one a plugin registers; a kv_connector in --kv-transfer-config "
        "picks it too.",
    ),
    EngineOption(
        "kv_transfer_config",
        str,
        None,
        "ATOM --kv-transfer-config JSON, merged with what --role prefill/decode needs (kv_role, "
        "handshake_port, http_port); knobs such as protocol, ib_device, qp_per_transfer are kept.",
    ),
    EngineOption(
        "engine_port",
        int,
        0,
        "ATOM's internal engine port (its --port, default 8006: torch.distributed's MASTER_PORT). "
        "0: a free one per worker, so ATOM workers on one host do not collide.",
    ),
    EngineOption(
        "kv_events_port",
        int,
        0,
        "Port ATOM's KV event publisher binds (ATOM_KV_EVENTS_ENDPOINT); 0: a free one.",
    ),
    EngineOption(
        "dp_master_port",
        int,
        0,
        "ATOM's DP rendezvous port under -dp N (environment ATOM_DP_MASTER_PORT, ATOM's default "
        "29500). 0: a free one per worker (an ATOM_DP_MASTER_PORT you exported is kept).",
    ),
)


def _block_size(ctx: LaunchContext) -> int:
    block = int(ctx.options.get("block_size") or 16)
    if block <= 0:
        raise EngineError(f"--block-size {block}: must be a positive number of tokens")
    return block


def check_discovery(ctx: LaunchContext) -> None:
    """ATOM workers need etcd discovery; any other backend is refused at start-up."""
    if ctx.discovery is not None and ctx.discovery != REQUIRED_DISCOVERY:
        raise EngineError(
            f"the atom engine needs --discovery etcd (got --discovery {ctx.discovery}): "
            "ATOM workers are registered only through etcd"
        )


class AtomAdapter(AdapterBase):
    """Launches and watches one ATOM OpenAI server."""

    name = "atom"
    description = "ROCm ATOM OpenAI server: etcd discovery only, Mooncake PD on /v1/completions"
    package_hint = "pip install git+https://github.com/ROCm/ATOM.git (ROCm machines)"
    engine_options = OPTIONS
    aliases = ALIASES
    managed_flags = MANAGED_FLAGS

    def build_launch(self, ctx: LaunchContext) -> LaunchSpec:
        check_discovery(ctx)  # before the managed flags: the backend is the first thing to fix
        return super().build_launch(ctx)

    def launch(self, ctx: LaunchContext) -> LaunchSpec:
        flags = self.engine_flags(ctx)
        where = locate_engine(
            ctx,
            script_name=None,
            module=SERVER_MODULE,
            dists=("atom",),
            package_hint=self.package_hint,
            engine_label="ATOM",
        )
        return LaunchSpec(
            argv=[where.python, "-m", SERVER_MODULE, *flags],
            env=launch_env(ctx),
            engine_version=where.probe.version,
        )

    def engine_flags(self, ctx: LaunchContext) -> list[str]:
        """Every ATOM flag (pure: no probe)."""
        block = _block_size(ctx)
        flags = [
            "--model",
            ctx.served_path,
            "--served-model-name",
            ctx.model,
            "--host",
            ctx.host,
            "--server-port",
            str(ctx.port),
            "-tp",
            str(int(ctx.options.get("tp") or 1)),
            "--block-size",
            str(block),
        ]
        transfer = transfer_plan(ctx)
        if transfer.config:
            flags += ["--kv-transfer-config", transfer.config_json()]
        flags += engine_port_flags(ctx)  # ATOM's internal --port: one per worker
        return flags + list(ctx.engine_args)

    def record_fields(self, ctx: LaunchContext) -> RecordFields:
        """KV events (off under ATOM DP), the PD params, and ``dp_size`` = ATOM's ``-dp``: one
        server fronting that many engine cores (the router's DP-attention endpoint shape)."""
        return RecordFields(
            kv_events=kv_events_info(ctx, _block_size(ctx)),
            pd=transfer_plan(ctx).pd,
            dp_size=dp_size(ctx),
        )

    async def in_flight(self, engine: RunningEngine) -> int | None:
        """Requests in ATOM from its ``/metrics`` gauges (None when ATOM cannot tell yet)."""
        import httpx

        try:
            response = await engine.client.get(f"{engine.url}/metrics")
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        return atom_in_flight(response.text)


def atom_in_flight(text: str) -> int | None:
    """The in-flight count in ATOM's Prometheus text: the sum of :data:`IN_FLIGHT_METRICS`, or
    None when they are absent or ATOM says it has no engine snapshot yet."""
    if metrics_sum(text, (SNAPSHOT_METRIC,)) == 0:
        return None
    total = metrics_sum(text, IN_FLIGHT_METRICS)
    return None if total is None else round(total)
