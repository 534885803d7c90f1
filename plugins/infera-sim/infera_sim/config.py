"""Command-line flags of the sim server (``python -m infera_sim.server``) and their values."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

from infera_core.engines.timing import TimingProfile, load_profile
from infera_core.errors import ConfigError

ROLES = ("mixed", "prefill", "decode")
TASKS = ("generate", "embed", "classify", "score")
"""``--task``: what the simulated model serves."""
PD_PROTOCOLS = ("vllm-nixl", "vllm-mooncake", "sglang-bootstrap", "vllm-moriio", "vllm-moriio-read")
DENSE_EXTERNAL_DP = (
    "ValueError: Non-MoE models do not support external data parallel mode. For external load "
    "balancing, launch independent vLLM instances without --data-parallel-* arguments."
)
"""What vLLM 0.32 says when it refuses external-LB DP for a dense model (``arg_utils.py``)."""
KV_LAYOUTS = ("map", "array")
SCHEDULING_POLICIES = ("fcfs", "priority")


@dataclass(slots=True)
class SimConfig:
    """Every knob of one sim engine process (defaults match the flags' defaults)."""

    host: str = "127.0.0.1"
    port: int = 8000
    model: str = "sim-model"
    advertise_host: str = "127.0.0.1"
    engine_id: str = ""
    seed: int = 0
    # tokenizer
    tokenizer_json: str | None = None
    vocab_size: int = 32000
    max_model_len: int = 4096
    task: str = "generate"
    """What the model serves: generate (chat, completions), or a pooling model's embed, classify
    or score (a cross-encoder): the routes vLLM mounts for it (``infera_sim.pooling``)."""
    default_max_tokens: int = 16
    eos_rate: float = 0.0
    # KV cache
    block_size: int = 16
    cache_blocks: int = 4096
    cpu_blocks: int = 0
    cpu_load_tokens_per_s: float = 200000.0
    kv_events_port: int | None = None
    kv_replay_port: int | None = None
    kv_events_layout: str = "map"
    kv_events_topic: str = "kv-events"
    kv_replay_buffer: int = 10000
    dp_rank: int | None = None
    dp_size: int = 1
    """DP-attention ranks behind this one server (SGLang ``--dp-size``): each its own engine."""
    data_parallel_size: int = 1
    """External-LB DP size (vLLM ``--data-parallel-size`` with ``--dp-rank``): this sim is one rank."""
    num_experts: int | None = None
    """The model's expert count as vLLM reads it from ``config.json`` (0: dense; None: not modelled)."""
    lora_modules: dict[str, str] = field(default_factory=dict)
    """LoRA adapters served besides ``model`` (vLLM ``--lora-modules name=path``): name → path."""
    # timing
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    scheduling_policy: str = "fcfs"
    """vLLM's ``--scheduling-policy``: ``fcfs``, or ``priority`` (waiting requests by the body's
    ``priority``, lower first, then arrival; a non-zero ``priority`` is refused under ``fcfs``)."""
    prefill_tokens_per_s: float = 20000.0
    prefill_base_ms: float = 0.0
    itl_base_ms: float = 5.0
    itl_slope_ms: float = 0.05
    speedup: float = 1.0
    profile: str | None = None
    """A timing profile (``infera-run calibrate``) whose values are the timing flags' defaults."""
    # PD
    role: str = "mixed"
    pd_protocol: str = "vllm-nixl"
    bootstrap_port: int | None = None
    kv_bytes_per_token: float = 131072.0
    transfer_gbps: float = 100.0
    pd_timeout_s: float = 30.0
    # faults
    fault_error_rate: float = 0.0
    fault_error_status: int = 500
    fault_crash_after: int = 0
    fault_hang: bool = False
    fault_slow_start: float = 0.0
    fault_kv_drop_rate: float = 0.0
    fault_kv_duplicate_rate: float = 0.0
    fault_kv_reorder: bool = False

    @property
    def kv_engine_id(self) -> str:
        """The KV connector engine id vLLM uses: ``<engine_id>_dp<rank>`` under data parallel
        (``EngineCoreProc.run_engine_core``: ``data_parallel_size > 1 or dp_rank > 0``)."""
        rank = self.dp_rank or 0
        return f"{self.engine_id}_dp{rank}" if self.data_parallel_size > 1 or rank > 0 else self.engine_id

    def refusal(self) -> str | None:
        """The line vLLM would die with at start for this setup, if any."""
        if self.data_parallel_size > 1 and self.num_experts == 0:
            return DENSE_EXTERNAL_DP
        return None

    @property
    def sleeps(self) -> bool:
        """False with ``--speedup inf``: steps advance simulated time without sleeping."""
        return math.isfinite(self.speedup)


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _rate(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    d = SimConfig()
    p = argparse.ArgumentParser(
        prog="python -m infera_sim.server",
        description="Infera simulated engine: OpenAI-compatible HTTP, vLLM KV events and metrics.",
    )
    a = p.add_argument
    a("--host", default=d.host, help="address to bind (default %(default)s)")
    a("--port", type=int, default=d.port, help="HTTP port (0 = pick a free one)")
    a("--model", default=d.model, help="served model name")
    a("--served-model-name", dest="model", help="alias of --model (vLLM spelling)")
    a("--advertise-host", default=d.advertise_host, help="host other processes use to reach this sim")
    a("--engine-id", default=d.engine_id, help="engine id reported in PD params (default: random)")
    a("--seed", type=int, default=d.seed, help="seed of the deterministic output tokens")
    a("--tokenizer-json", default=None, help="use a real HF tokenizer.json instead of the built-in one")
    a("--vocab-size", type=int, default=d.vocab_size, help="built-in tokenizer vocabulary size")
    a(
        "--task",
        choices=TASKS,
        default=d.task,
        help="what the model serves: generate (chat, completions) or a pooling model's embed"
        " (/v1/embeddings, /score, /rerank), classify (/classify) or score (a cross-encoder:"
        " /classify, /score, /rerank)",
    )
    a("--max-model-len", type=int, default=d.max_model_len, help="longest prompt + output, in tokens")
    a("--default-max-tokens", type=int, default=d.default_max_tokens, help="output length without max_tokens")
    a("--eos-rate", type=_rate, default=d.eos_rate, help="per-token probability of EOS (not with ignore_eos)")
    a("--block-size", type=int, default=d.block_size, help="KV block size in tokens")
    a("--cache-blocks", type=int, default=d.cache_blocks, help="KV cache capacity in blocks")
    a(
        "--cpu-blocks",
        type=int,
        default=d.cpu_blocks,
        help="CPU tier capacity in blocks: GPU evictions move there (vLLM KV offloading; 0 = none)",
    )
    a(
        "--cpu-load-tokens-per-s",
        type=_positive_float,
        default=d.cpu_load_tokens_per_s,
        help="speed of loading a CPU-tier prefix back to the GPU, in tokens/s",
    )
    a("--kv-events-port", type=int, default=None, help="ZMQ PUB port for KV events (0 = free; unset = off)")
    a("--kv-replay-port", type=int, default=None, help="ZMQ ROUTER replay port (0 = free; unset = off)")
    a("--kv-events-layout", choices=KV_LAYOUTS, default=d.kv_events_layout, help="map (vLLM>=0.24) or array")
    a("--kv-events-topic", default=d.kv_events_topic, help="ZMQ topic frame")
    a("--kv-replay-buffer", type=int, default=d.kv_replay_buffer, help="batches kept for replay")
    a("--dp-rank", type=int, default=None, help="dp_rank written in KV event batches")
    a(
        "--dp-size",
        type=int,
        default=d.dp_size,
        help="DP-attention ranks behind this server, as SGLang --dp-size: rank r has its own engine and"
        " KV cache, publishes on --kv-events-port + r (replay port + r) with dp_rank r; the"
        " X-Data-Parallel-Rank header picks the rank, round robin without it",
    )
    a(
        "--data-parallel-size",
        type=int,
        default=d.data_parallel_size,
        help="external-LB data-parallel size, as vLLM's (this sim is rank --dp-rank): the KV connector"
        " engine id becomes <engine-id>_dp<rank>, and a dense model (--num-experts 0) is refused",
    )
    a(
        "--num-experts",
        type=int,
        default=None,
        help="the model's expert count, as vLLM reads config.json (0 = dense: vLLM refuses external"
        " data parallel for it; unset = not modelled)",
    )
    a("--max-num-seqs", type=int, default=d.max_num_seqs, help="most requests running at once")
    a("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens, help="token budget per step")
    a(
        "--scheduling-policy",
        choices=SCHEDULING_POLICIES,
        default=d.scheduling_policy,
        help="order of waiting requests, as vLLM's: fcfs, or priority (the body's priority, lower first)",
    )
    a("--prefill-tokens-per-s", type=_positive_float, default=d.prefill_tokens_per_s, help="prefill speed")
    a(
        "--prefill-base-ms",
        type=_non_negative_float,
        default=d.prefill_base_ms,
        help="fixed time of a step that prefills (on top of uncached tokens / --prefill-tokens-per-s)",
    )
    a("--itl-base-ms", type=float, default=d.itl_base_ms, help="decode step time with one request")
    a("--itl-slope-ms", type=float, default=d.itl_slope_ms, help="extra decode step time per running request")
    a(
        "--profile",
        default=None,
        metavar="FILE",
        help="timing profile written by 'infera-run calibrate': sets --prefill-tokens-per-s,"
        " --prefill-base-ms, --itl-base-ms, --itl-slope-ms (and the batch limits and block size it"
        " knows); flags given explicitly win",
    )
    a(
        "--speedup",
        type=_positive_float,
        default=d.speedup,
        help="divide all sleeps by this ('inf' = never sleep)",
    )
    a("--role", choices=ROLES, default=d.role, help="mixed, prefill or decode (PD disaggregation)")
    a("--pd-protocol", choices=PD_PROTOCOLS, default=d.pd_protocol, help="PD request shape")
    a(
        "--bootstrap-port",
        type=int,
        default=None,
        help="KV transfer/bootstrap HTTP port of a prefill sim (0 = free)",
    )
    a(
        "--kv-bytes-per-token",
        type=float,
        default=d.kv_bytes_per_token,
        help="KV size per token (transfer time)",
    )
    a("--transfer-gbps", type=_positive_float, default=d.transfer_gbps, help="PD transfer bandwidth, Gbit/s")
    a("--pd-timeout-s", type=float, default=d.pd_timeout_s, help="how long a decode waits for prefill KV")
    a("--fault-error-rate", type=_rate, default=0.0, help="fraction of requests answered with an error")
    a(
        "--fault-error-status",
        type=int,
        choices=(500, 429, 503),
        default=500,
        help="status of injected errors",
    )
    a("--fault-crash-after", type=int, default=0, help="exit the process after N requests (0 = never)")
    a("--fault-hang", action="store_true", help="accept requests and never answer them")
    a("--fault-slow-start", type=float, default=0.0, help="/health answers 503 for this many seconds")
    a("--fault-kv-drop-rate", type=_rate, default=0.0, help="fraction of KV event batches not sent")
    a("--fault-kv-duplicate-rate", type=_rate, default=0.0, help="fraction of KV event batches sent twice")
    a("--fault-kv-reorder", action="store_true", help="swap consecutive KV event batches")
    a("--enable-lora", action="store_true", help="accepted for vLLM compatibility (adapters need no weights)")
    a(
        "--lora-modules",
        nargs="+",
        default=[],
        metavar="NAME=PATH",
        help="LoRA adapters to serve, as vLLM takes them (name=path or JSON with name and path);"
        " requests naming one get its own prefix cache, and its KV events carry lora_name",
    )
    return p


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def profile_defaults(profile: TimingProfile) -> dict[str, object]:
    """The sim flags (dest names) a timing profile sets."""
    out: dict[str, object] = {
        "prefill_tokens_per_s": profile.prefill_tokens_per_s,
        "prefill_base_ms": profile.prefill_base_ms,
        "itl_base_ms": profile.itl_base_ms,
        "itl_slope_ms": profile.itl_slope_ms,
    }
    for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "cache_blocks"):
        value = getattr(profile, name)
        if value is not None:
            out[name] = value
    return out


def parser_for(argv: Sequence[str] | None) -> argparse.ArgumentParser:
    """The sim's parser, with a ``--profile`` in ``argv`` applied as defaults (ConfigError if bad)."""
    parser = build_parser()
    pre, _ = parser.parse_known_args(argv)
    if pre.profile:
        parser.set_defaults(**profile_defaults(load_profile(pre.profile)))
    return parser


def lora_modules(specs: Sequence[str]) -> dict[str, str]:
    """vLLM's ``--lora-modules`` values as name → path; ValueError naming a bad one."""
    out: dict[str, str] = {}
    for spec in specs:
        if spec.lstrip().startswith("{"):
            try:
                item = json.loads(spec)
                name, path = str(item["name"]), str(item["path"])
            except (ValueError, KeyError, TypeError):
                raise ValueError(f"--lora-modules {spec!r}: JSON needs 'name' and 'path'") from None
        else:
            name, sep, path = spec.partition("=")
            if not sep or not name or not path:
                raise ValueError(f"--lora-modules {spec!r}: expected name=path")
        out[name] = path
    return out


def parse_args(argv: Sequence[str] | None = None) -> SimConfig:
    """Parse flags into a :class:`SimConfig`; exits with a one-line usage error on bad input."""
    try:
        parser = parser_for(argv)
    except ConfigError as exc:
        build_parser().error(str(exc))
    ns = parser.parse_args(argv)
    try:
        ns.lora_modules = lora = lora_modules(ns.lora_modules)
    except ValueError as exc:
        parser.error(str(exc))
    cfg = SimConfig(**{f.name: getattr(ns, f.name) for f in fields(SimConfig) if hasattr(ns, f.name)})
    if cfg.model in lora:
        parser.error(f"--lora-modules {cfg.model!r}: an adapter cannot have the served model's name")
    for name, value in (("--block-size", cfg.block_size), ("--cache-blocks", cfg.cache_blocks)):
        if value <= 0:
            parser.error(f"{name} must be > 0")
    if cfg.cpu_blocks < 0:
        parser.error("--cpu-blocks must be >= 0")
    if cfg.max_num_seqs <= 0 or cfg.max_num_batched_tokens <= 0:
        parser.error("--max-num-seqs and --max-num-batched-tokens must be > 0")
    if cfg.dp_size < 1:
        parser.error("--dp-size must be >= 1")
    if cfg.data_parallel_size < 1:
        parser.error("--data-parallel-size must be >= 1")
    if cfg.data_parallel_size > 1 and cfg.dp_rank is None:
        parser.error("--data-parallel-size needs --dp-rank (one sim per external-LB rank)")
    if cfg.dp_rank is not None and cfg.data_parallel_size > 1 and cfg.dp_rank >= cfg.data_parallel_size:
        parser.error("--dp-rank must be below --data-parallel-size")
    if cfg.dp_size > 1 and cfg.dp_rank is not None:
        parser.error("--dp-rank is for one rank per server; with --dp-size > 1 every batch names its rank")
    return cfg
