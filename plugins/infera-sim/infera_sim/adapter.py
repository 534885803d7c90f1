"""The ``sim`` engine adapter: how ``infera-run worker sim`` starts and watches a sim engine."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from infera_core.engines.base import EngineOption, LaunchContext, LaunchSpec, RecordFields, RunningEngine
from infera_core.engines.support import bracket_host, free_ports
from infera_core.engines.timing import Publish, TimingProfile, VirtualEngine
from infera_core.errors import ConfigError, EngineError
from infera_core.worker import KvEventsInfo, PdInfo, PriorityOrder
from infera_sim import __version__
from infera_sim.config import (
    KV_LAYOUTS,
    PD_PROTOCOLS,
    SCHEDULING_POLICIES,
    TASKS,
    SimConfig,
    lora_modules,
    parser_for,
)
from infera_sim.metrics import parse_gauges
from infera_sim.tokenizer import make_tokenizer
from infera_sim.virtual import VirtualSim, virtual_config

_INFLIGHT = ("vllm:num_requests_running", "vllm:num_requests_waiting")


def _dp_size(ctx: LaunchContext) -> int:
    """DP-attention ranks behind this one sim (``--dp-size``, as SGLang's): 1 unless set."""
    return int(ctx.options.get("dp_size") or 1)


class SimAdapter:
    """Launches ``python -m infera_sim.server`` with KV events, replay and PD wired up."""

    name = "sim"
    description = "Simulated engine speaking vLLM's HTTP, KV event and metrics formats (no GPU needed)."
    package_hint = "pip install infera-sim"

    def options(self) -> Sequence[EngineOption]:
        return (
            EngineOption("block_size", int, 16, "KV block size in tokens"),
            EngineOption("cache_blocks", int, 4096, "KV cache capacity in blocks"),
            EngineOption(
                "cpu_blocks",
                int,
                None,
                "CPU tier capacity in blocks: GPU evictions move there, as with vLLM KV offloading "
                "[default: 0, none]",
            ),
            EngineOption(
                "cpu_load_tokens_per_s",
                float,
                None,
                "speed of loading a CPU-tier prefix back to the GPU [default: 200000 tokens/s]",
            ),
            EngineOption(
                "dp_size",
                int,
                1,
                "DP-attention ranks behind this one sim, as SGLang --dp-size: a cache and a KV publisher"
                " per rank (port + r); the X-Data-Parallel-Rank header picks the rank",
            ),
            EngineOption(
                "task",
                str,
                None,
                "what the model serves: generate, or a pooling model's embed (/v1/embeddings, /score,"
                " /rerank), classify (/classify) or score (a cross-encoder) [default: generate]",
                choices=TASKS,
            ),
            EngineOption(
                "profile",
                str,
                None,
                "timing profile from 'infera-run calibrate' (JSON): the sim's prefill, decode and batch"
                " timing become the measured engine's",
            ),
            EngineOption("speedup", float, 1.0, "simulated time runs this much faster ('inf' = no sleeping)"),
            EngineOption(
                "kv_events_layout",
                str,
                "map",
                "KV event layout: map (vLLM>=0.24) or array",
                choices=KV_LAYOUTS,
            ),
            EngineOption(
                "scheduling_policy",
                str,
                None,
                "order of the sim's waiting requests, as vLLM --scheduling-policy: fcfs, or priority (the"
                " body's priority, lower first; the worker record tells the router to send it) [default: fcfs]",
                choices=SCHEDULING_POLICIES,
            ),
            EngineOption(
                "pd_protocol",
                str,
                "vllm-nixl",
                "PD request shape for prefill/decode roles",
                choices=PD_PROTOCOLS,
            ),
        )

    def _ports_for(self, ctx: LaunchContext) -> tuple[int, int, int | None]:
        """KV publisher, replay and (prefill) bootstrap ports, picked once per launch (``ctx.ports``)."""
        if not ctx.ports:
            n = _dp_size(ctx)
            if n > 1:  # one publisher per DP-attention rank on port + r, as SGLang does
                ctx.ports.update(kv=free_ports(ctx, n, consecutive=True)[0])
                ctx.ports.update(replay=free_ports(ctx, n, consecutive=True)[0])
            else:
                ctx.ports.update(kv=ctx.free_port(), replay=ctx.free_port())
            if str(ctx.role) == "prefill":
                ctx.ports["bootstrap"] = ctx.free_port()
        return ctx.ports["kv"], ctx.ports["replay"], ctx.ports.get("bootstrap")

    def _argv_flags(self, ctx: LaunchContext) -> list[str]:
        kv, replay, bootstrap = self._ports_for(ctx)
        opts = ctx.options
        flags = [
            "--host", ctx.host,
            "--port", str(ctx.port),
            "--model", ctx.model,
            "--advertise-host", ctx.advertise_host,
            "--engine-id", ctx.worker_id,
            "--kv-events-port", str(kv),
            "--kv-replay-port", str(replay),
            "--role", str(ctx.role),
        ]  # fmt: skip
        for name in (
            "block_size",
            "cache_blocks",
            "cpu_blocks",
            "cpu_load_tokens_per_s",
            "speedup",
            "profile",
            "kv_events_layout",
            "scheduling_policy",
            "pd_protocol",
            "task",
        ):
            if opts.get(name) is not None:
                flags += ["--" + name.replace("_", "-"), str(opts[name])]
        if bootstrap is not None:
            flags += ["--bootstrap-port", str(bootstrap)]
        if ctx.dp_rank is not None:
            flags += ["--dp-rank", str(ctx.dp_rank)]
            if ctx.dp_size > 1:  # one external-LB rank, as vLLM's --data-parallel-size/-rank
                flags += ["--data-parallel-size", str(ctx.dp_size)]
        if _dp_size(ctx) > 1:
            flags += ["--dp-size", str(_dp_size(ctx))]
        return flags + list(ctx.engine_args)

    def effective_config(self, ctx: LaunchContext) -> SimConfig:
        """The sim's configuration for this launch (engine args after ``--`` win)."""
        flags = self._argv_flags(ctx)
        try:
            parser = parser_for(flags)
        except ConfigError as exc:
            raise EngineError(f"sim: {exc}") from None
        try:
            ns, unknown = parser.parse_known_args(flags)
        except SystemExit:
            raise EngineError(f"sim: bad engine arguments after '--': {' '.join(ctx.engine_args)}") from None
        if unknown:
            raise EngineError(
                f"sim: unknown engine arguments: {' '.join(unknown)} (see python -m infera_sim.server --help)"
            )
        try:
            ns.lora_modules = lora_modules(ns.lora_modules)
        except ValueError as exc:
            raise EngineError(f"sim: {exc}") from None
        cfg = SimConfig()
        for key, value in vars(ns).items():
            if hasattr(cfg, key):
                setattr(cfg, key, value)
        return cfg

    def build_launch(self, ctx: LaunchContext) -> LaunchSpec:
        self.effective_config(ctx)  # validates engine args early, with a clear message
        python = ctx.engine_python or sys.executable
        return LaunchSpec(
            argv=[python, "-m", "infera_sim.server", *self._argv_flags(ctx)], env={"PYTHONUNBUFFERED": "1"}
        )

    def record_fields(self, ctx: LaunchContext) -> RecordFields:
        cfg = self.effective_config(ctx)
        host = bracket_host(ctx.advertise_host)
        kv_events = KvEventsInfo(
            endpoint=f"tcp://{host}:{cfg.kv_events_port}",
            format="vllm",
            block_size=cfg.block_size,
            replay_endpoint=f"tcp://{host}:{cfg.kv_replay_port}" if cfg.kv_replay_port is not None else None,
            topic=cfg.kv_events_topic,
            fingerprint=make_tokenizer(cfg.tokenizer_json, cfg.vocab_size).fingerprint,
            port_per_dp_rank=cfg.dp_size > 1,
        )
        pd = None
        if cfg.role in ("prefill", "decode"):
            # the id the engine's KV connector uses (vLLM: <engine-id>_dp<rank> under DP)
            params: dict[str, object] = {"engine_id": cfg.kv_engine_id}
            if cfg.role == "prefill" and cfg.bootstrap_port is not None:
                params.update(bootstrap_host=host, bootstrap_port=cfg.bootstrap_port)
                if cfg.pd_protocol.startswith("vllm-moriio"):  # the decode fetches from this port
                    port = cfg.bootstrap_port
                    params.update(host=ctx.advertise_host, handshake_port=port, notify_port=port)
            pd = PdInfo(protocol=cfg.pd_protocol, params=params)
        return RecordFields(
            engine_version=f"infera-sim-{__version__}",
            kv_events=kv_events,
            pd=pd,
            dp_rank=ctx.dp_rank,
            dp_size=cfg.dp_size if cfg.dp_size > 1 else ctx.dp_size,
            labels={"engine": "sim"},
            priority=PriorityOrder.LOWER_FIRST if cfg.scheduling_policy == "priority" else None,
        )

    def virtual_engine(
        self, profile: TimingProfile, block_size: int, cache_blocks: int, publish: Publish | None
    ) -> VirtualEngine:
        """An in-process sim on a virtual clock (``infera-run plan``)."""
        return VirtualSim(virtual_config(profile, block_size, cache_blocks), publish)

    async def is_ready(self, engine: RunningEngine) -> bool:
        import httpx

        try:
            return (await engine.client.get(engine.url + "/health", timeout=2.0)).status_code == 200
        except httpx.HTTPError:
            return False

    async def in_flight(self, engine: RunningEngine) -> int | None:
        import httpx

        try:
            resp = await engine.client.get(engine.url + "/metrics", timeout=2.0)
        except httpx.HTTPError:
            return None
        if resp.status_code != 200:
            return None
        values = parse_gauges(resp.text, _INFLIGHT)
        if not values:
            return None
        return int(sum(values.values()))
