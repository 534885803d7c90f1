"""The SGLang engine adapter: ``infera-run worker sglang [infera flags] -- [sglang flags]``.

Builds ``<python> -m sglang.launch_server --model-path <path>`` with a real page size (SGLang
publishes one KV event per page; page size 1 drowns the router), ZMQ KV events (one port
per DP-attention rank), metrics, tensor parallel, DP-attention and PD bootstrap.
Never imports SGLang.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from infera_core.engines.base import (
    EngineOption,
    FlagAlias,
    LaunchContext,
    LaunchSpec,
    RecordFields,
    RunningEngine,
)
from infera_core.engines.support import (
    AdapterBase,
    bracket_host,
    dp_layout,
    free_ports,
    locate_engine,
    metrics_in_flight,
)
from infera_core.errors import EngineError
from infera_core.worker import KvEventsInfo, PriorityOrder
from infera_sglang import offload
from infera_sglang.parallel import (
    DP_MODES,
    DP_PLAIN,
    decode_radix_flags,
    dp_mode,
    parallel_flags,
    plain_dp_flags,
)
from infera_sglang.transfer import transfer_plan

LAUNCH_MODULE = "sglang.launch_server"
KV_TOPIC = "kv-events"
IN_FLIGHT_METRICS = ("sglang:num_running_reqs", "sglang:num_queue_reqs")

MANAGED_FLAGS = {
    "--model-path": "--model-path",
    "--model": "--model-path",
    "--host": "infera's --host",
    "--port": "infera's --port",
    "--served-model-name": "infera's --model",
    "--page-size": "--page-size",
    "--kv-events-config": "infera's KV events (always on)",
    "--tp-size": "--tp",
    "--tp": "--tp",
    "--dp-size": "infera's --dp-size",
    "--dp": "infera's --dp-size",
    "--disaggregation-mode": "--role",
    "--disaggregation-bootstrap-port": "infera's PD bootstrap (advertised in the worker record)",
    "--disaggregation-transfer-backend": "--transfer-backend",
}

ALIASES: Mapping[str, FlagAlias] = {
    "--tp-size": FlagAlias("--tp"),
    "--tensor-parallel-size": FlagAlias("--tp"),
    "--dp": FlagAlias("--dp-size"),
    "--data-parallel-size": FlagAlias("--dp-size"),
    "--dp-size": FlagAlias("--dp-size"),
    "--page-size": FlagAlias("--page-size"),
    "--disaggregation-mode": FlagAlias(
        "--role", values={"null": "mixed", "prefill": "prefill", "decode": "decode"}
    ),
    "--disaggregation-transfer-backend": FlagAlias("--transfer-backend"),
    "--enable-kv-events": FlagAlias("", takes_value=False),
    "--enable-dp-attention": FlagAlias("", takes_value=False),  # added with --dp-size > 1
}
"""SGLang's spellings of what Infera manages (``python -m infera.engine.sglang``, or after ``--``)."""
SERVER_INFO_PATHS = ("/get_server_info", "/server_info")

OPTIONS: tuple[EngineOption, ...] = (
    EngineOption(
        "page_size",
        int,
        16,
        "KV page size (SGLang --page-size), also the router's hashing block. Never 1: SGLang sends "
        "one KV event per page.",
    ),
    EngineOption("tp", int, 1, "Tensor-parallel size (SGLang --tp-size)."),
    EngineOption(
        "transfer_backend",
        str,
        "mooncake",
        "KV transfer backend for --role prefill/decode (SGLang --disaggregation-transfer-backend): "
        "mooncake, nixl, mori, mooncake_tcp, ascend, or one a plugin registers.",
    ),
    EngineOption(
        "kv_events_port",
        int,
        0,
        "First KV event port (0: pick free ones); DP-attention rank r publishes on port + r.",
    ),
    EngineOption(
        "dp_size",
        int,
        1,
        "Data-parallel size (SGLang --dp-size): DP-attention ranks behind this one server, or with "
        "--dp-mode plain the number of replicas (one launcher each, --dp-rank K).",
    ),
    EngineOption(
        "dp_rank",
        int,
        None,
        "With --dp-mode plain: this launcher's replica, 0 … --dp-size - 1 (refused under DP-attention, "
        "where one launcher fronts every rank).",
    ),
    EngineOption(
        "dp_mode",
        str,
        "attention",
        f"How --dp-size is run: {' or '.join(DP_MODES)}. attention: one server, --enable-dp-attention, "
        "the router picks the rank; plain: SGLang's plain DP as one launcher per replica (--dp-rank K), "
        "each an ordinary worker on GPUs from K x tp.",
    ),
    EngineOption(
        "enable_priority_scheduling",
        bool,
        False,
        "SGLang --enable-priority-scheduling: waiting requests by the body's priority (larger first);"
        " the worker record says so and the router forwards each request's tier as its priority.",
        is_flag=True,
    ),
    EngineOption(
        "schedule_low_priority_values_first",
        bool,
        False,
        "SGLang --schedule-low-priority-values-first: with priority scheduling, smaller values first"
        " (as vLLM); the router sends the values the other way round.",
        is_flag=True,
    ),
    *offload.OPTIONS,
)


def _priority_order(ctx: LaunchContext) -> PriorityOrder | None:
    """How the launched SGLang orders by ``priority`` (None: no priority scheduling)."""
    if not ctx.options.get("enable_priority_scheduling"):
        return None
    if ctx.options.get("schedule_low_priority_values_first"):
        return PriorityOrder.LOWER_FIRST
    return PriorityOrder.HIGHER_FIRST


def _page_size(ctx: LaunchContext) -> int:
    size = int(ctx.options.get("page_size") or 16)
    if size == 1:
        raise EngineError(
            "--page-size 1: SGLang would publish one KV event per token; use 16 or 32 (the default is 16)"
        )
    if size <= 0:
        raise EngineError(f"--page-size {size}: must be a positive number of tokens")
    return size


def _dp(ctx: LaunchContext) -> int:
    """The DP-attention ranks behind this one SGLang server (1 for a plain-DP replica)."""
    rank, size = dp_layout(ctx)
    if dp_mode(ctx) == DP_PLAIN:
        if size > 1 and rank is None:
            raise EngineError(
                f"--dp-mode plain --dp-size {size}: one SGLang server cannot run plain DP with KV events "
                "(every rank's publisher binds the same port without DP-attention); start one launcher per "
                "replica with --dp-rank 0 … --dp-rank "
                f"{size - 1} (each its own worker), or use --dp-mode attention"
            )
        return 1
    if size > 1 and rank is not None:
        raise EngineError(
            "SGLang DP-attention: one launcher fronts all --dp-size ranks; drop --dp-rank "
            "(the router steers requests with the X-Data-Parallel-Rank header)"
        )
    return size


def _ports(ctx: LaunchContext) -> dict[str, int]:
    if not ctx.ports:
        n = _dp(ctx)
        wanted = int(ctx.options.get("kv_events_port") or 0)
        kv = wanted or free_ports(ctx, n, consecutive=True)[0]
        replay = free_ports(ctx, n, consecutive=True)[0]
        ctx.ports.update(kv=kv, replay=replay)
    return ctx.ports


class SglangAdapter(AdapterBase):
    """Launches and watches one SGLang server (all of its DP-attention ranks)."""

    name = "sglang"
    description = "SGLang server (sglang.launch_server): page-size KV events, DP-attention, bootstrap PD"
    package_hint = "pip install 'sglang[all]'"
    engine_options = OPTIONS
    aliases = ALIASES
    managed_flags = MANAGED_FLAGS

    def launch(self, ctx: LaunchContext) -> LaunchSpec:
        flags = self.engine_flags(ctx)
        where = locate_engine(
            ctx,
            script_name="sglang",
            module=LAUNCH_MODULE,
            dists=("sglang",),
            package_hint=self.package_hint,
            engine_label="SGLang",
        )
        return LaunchSpec(
            argv=[where.python, "-m", LAUNCH_MODULE, *flags], engine_version=where.probe.version
        )

    def engine_flags(self, ctx: LaunchContext) -> list[str]:
        """Every SGLang flag (pure: no probe)."""
        ports = _ports(ctx)
        kv_config = {
            "publisher": "zmq",
            "endpoint": f"tcp://*:{ports['kv']}",
            "replay_endpoint": f"tcp://*:{ports['replay']}",
            "topic": KV_TOPIC,
        }
        flags = [
            "--model-path",
            ctx.served_path,
            "--served-model-name",
            ctx.model,
            "--host",
            ctx.host,
            "--port",
            str(ctx.port),
            "--page-size",
            str(_page_size(ctx)),
            "--enable-metrics",
            "--kv-events-config",
            json.dumps(kv_config, separators=(",", ":")),
        ]
        flags += parallel_flags(ctx, _dp(ctx))  # --tp-size defaults to --dp-size under DP-attention
        if dp_mode(ctx) == DP_PLAIN:
            flags += plain_dp_flags(ctx, dp_layout(ctx)[0])  # replica K's GPUs
        flags += transfer_plan(ctx).flags
        flags += decode_radix_flags(ctx)  # a decode worker's KV events need its radix cache
        flags += offload.offload_flags(ctx)  # HiCache / LMCache
        order = _priority_order(ctx)
        if order is not None:
            flags.append("--enable-priority-scheduling")
            if order is PriorityOrder.LOWER_FIRST:
                flags.append("--schedule-low-priority-values-first")
        return flags + list(ctx.engine_args)

    def record_fields(self, ctx: LaunchContext) -> RecordFields:
        ports = _ports(ctx)
        host = bracket_host(ctx.advertise_host)
        dp = _dp(ctx)
        kv = KvEventsInfo(
            endpoint=f"tcp://{host}:{ports['kv']}",
            format="sglang",
            block_size=_page_size(ctx),
            replay_endpoint=f"tcp://{host}:{ports['replay']}",
            topic=KV_TOPIC,
            port_per_dp_rank=dp > 1,
        )
        pd = transfer_plan(ctx).pd
        return RecordFields(
            kv_events=kv,
            pd=pd,
            dp_rank=None,
            dp_size=dp,
            # SGLang mounts every route for every model: its flag, not its routes, says the kind
            tasks=["embed"] if "--is-embedding" in ctx.engine_args else ["generate"],
            priority=_priority_order(ctx),
        )

    async def served_block_size(self, engine: RunningEngine) -> int | None:
        """The page size SGLang really uses (``page_size`` in its server info)."""
        for path in SERVER_INFO_PATHS:
            response = await engine.client.get(f"{engine.url}{path}")
            if response.status_code == 200:
                size = response.json().get("page_size")
                return size if isinstance(size, int) else None
        return None

    async def in_flight(self, engine: RunningEngine) -> int | None:
        return await metrics_in_flight(engine.client, engine.url, IN_FLIGHT_METRICS)

    async def health_generate(self, engine: RunningEngine) -> bool:
        """SGLang's own one-token check (it handles prefill/decode modes itself); the launcher
        bounds it with --health-generate-timeout."""
        response = await engine.client.get(f"{engine.url}/health_generate", timeout=None)
        return response.status_code == 200
