"""TensorRT-LLM KV events for Infera: the LLM API settings that turn them on, the record, the poll.

TRT-LLM publishes KV events only when ``kv_cache_config.event_buffer_max_size`` > 0 and block
reuse is on (``enable_block_reuse``, the default; ``--disable_kv_cache_reuse`` turns it off):
``KvCacheConfig`` in ``tensorrt_llm/llmapi/llm_args.py``. ``trtllm-serve`` reads LLM API
settings from one YAML file (``--config`` / ``--extra_llm_api_options``), so Infera writes
one: the user's file (when given after ``--``) with ``kv_cache_config.event_buffer_max_size``
and ``tokens_per_block`` (``--block-size``; TRT-LLM's default 32) set. The events are then
read from ``POST /kv_cache_events`` by the launcher (:meth:`poll`) and published on the
record's ZMQ ports; routers decode them with :mod:`infera_openai.trtllm_events`.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import msgspec

from infera_core.engines.base import LaunchContext, RunningEngine
from infera_core.engines.support import bracket_host, free_ports
from infera_core.errors import EngineError
from infera_core.worker import KvEventsInfo, PdInfo, Role
from infera_openai.trtllm_events import FORMAT
from infera_openai.trtllm_pd import BACKENDS, PROTOCOL

CONFIG_FLAGS = ("--config", "--extra_llm_api_options")
NO_REUSE = "--disable_kv_cache_reuse"
EVENT_BUFFER = 16384
"""``event_buffer_max_size``: events TRT-LLM keeps between two polls."""
TOPIC = "kv-events"
EVENTS_PATH = "/kv_cache_events"


def enabled(ctx: LaunchContext) -> bool:
    """KV events are on unless ``--no-kv-events`` or block reuse is off."""
    if ctx.options.get("kv_events") is False:
        return False
    return NO_REUSE not in {a.split("=", 1)[0] for a in ctx.engine_args}


def block_size(ctx: LaunchContext) -> int:
    size = int(ctx.options.get("block_size") or 32)
    if size <= 0:
        raise EngineError(f"--block-size {size}: must be a positive number of tokens")
    return size


def user_config_path(engine_args: list[str]) -> tuple[int, int, str] | None:
    """(index, token count, path) of the user's ``--config``/``--extra_llm_api_options``."""
    for i, arg in enumerate(engine_args):
        name, eq, inline = arg.partition("=")
        if name in CONFIG_FLAGS:
            if eq:
                return i, 1, inline
            if i + 1 >= len(engine_args):
                raise EngineError(f"{name} needs a path")
            return i, 2, engine_args[i + 1]
    return None


def needs_config(ctx: LaunchContext) -> bool:
    """Infera writes the LLM API YAML for KV events and for a prefill/decode role."""
    return enabled(ctx) or ctx.role is not Role.MIXED


def transfer_backend(ctx: LaunchContext) -> str:
    backend = str(ctx.options.get("transfer_backend") or "DEFAULT").upper()
    if backend not in BACKENDS:
        raise EngineError(f"--transfer-backend {backend}: expected one of {', '.join(BACKENDS)}")
    return backend


def pd_info(ctx: LaunchContext) -> PdInfo | None:
    if ctx.role is Role.MIXED:
        return None
    return PdInfo(protocol=PROTOCOL, params={"backend": transfer_backend(ctx)})


def llm_api_config(ctx: LaunchContext) -> dict[str, Any]:
    """The LLM API settings to launch with: the user's YAML plus what KV events and the
    role need (``cache_transceiver_config``; a context server without the overlap scheduler)."""
    import yaml

    found = user_config_path(list(ctx.engine_args))
    config: dict[str, Any] = {}
    if found is not None:
        path = found[2]
        try:
            with open(path, encoding="utf-8") as f:
                loaded = yaml.safe_load(f)
        except OSError as exc:
            raise EngineError(f"{CONFIG_FLAGS[0]} {path}: cannot read it ({exc.strerror})") from None
        except yaml.YAMLError as exc:
            raise EngineError(f"{CONFIG_FLAGS[0]} {path}: not YAML ({type(exc).__name__})") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise EngineError(f"{CONFIG_FLAGS[0]} {path}: expected a mapping of LLM API settings")
        config = dict(loaded or {})
    if ctx.role is not Role.MIXED:
        transceiver = dict(config.get("cache_transceiver_config") or {})
        transceiver.setdefault("backend", transfer_backend(ctx))  # the YAML's own backend wins
        config["cache_transceiver_config"] = transceiver
        if ctx.role is Role.PREFILL:
            config["disable_overlap_scheduler"] = True
    if not enabled(ctx):
        return config
    kv = dict(config.get("kv_cache_config") or {})
    if kv.get("enable_block_reuse") is False:
        raise EngineError(
            "kv_cache_config.enable_block_reuse: false: TRT-LLM publishes no KV events without block "
            "reuse; drop it, or pass --no-kv-events"
        )
    kv["event_buffer_max_size"] = max(int(kv.get("event_buffer_max_size") or 0), EVENT_BUFFER)
    kv["tokens_per_block"] = block_size(ctx)
    config["kv_cache_config"] = kv
    return config


def config_flags(ctx: LaunchContext, path: str) -> tuple[list[str], list[str]]:
    """(``--extra_llm_api_options <path>`` (every trtllm-serve has it; newer ones also spell it
    ``--config``), the engine flags without the user's own config flag)."""
    args = list(ctx.engine_args)
    found = user_config_path(args)
    if found is not None:
        del args[found[0] : found[0] + found[1]]
    return ["--extra_llm_api_options", path], args


def config_path(ctx: LaunchContext) -> str:
    """Where the worker's LLM API YAML goes: ``<tmp>/infera-trtllm-<worker id>.yaml``."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in ctx.worker_id)
    return os.path.join(tempfile.gettempdir(), f"infera-trtllm-{safe}.yaml")


def write_config(ctx: LaunchContext) -> str:
    """Write :func:`llm_api_config` (as JSON, which is YAML) for this worker; its path.

    Written to a fresh temp file, then renamed over the path (atomic; a link planted there is
    replaced, never written through)."""
    data = msgspec.json.encode(llm_api_config(ctx))
    path = config_path(ctx)
    try:
        fd, tmp = tempfile.mkstemp(prefix=".infera-trtllm-", suffix=".yaml", dir=os.path.dirname(path))
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        raise EngineError(f"cannot write the TensorRT-LLM settings file {path}: {exc.strerror}") from None
    return path


def ports(ctx: LaunchContext) -> dict[str, int]:
    if "kv" not in ctx.ports:
        wanted = int(ctx.options.get("kv_events_port") or 0)
        kv, replay = free_ports(ctx, 2)
        ctx.ports.update(kv=wanted or kv, replay=replay if replay != wanted else kv)
    return ctx.ports


def kv_events_info(ctx: LaunchContext) -> KvEventsInfo:
    p = ports(ctx)
    host = bracket_host(ctx.advertise_host)
    return KvEventsInfo(
        endpoint=f"tcp://{host}:{p['kv']}",
        format=FORMAT,
        block_size=block_size(ctx),
        replay_endpoint=f"tcp://{host}:{p['replay']}",
        topic=TOPIC,
    )


async def poll(engine: RunningEngine) -> list[bytes]:
    """One ``POST /kv_cache_events``: the events it handed out, one payload per attention DP rank."""
    response = await engine.client.post(f"{engine.url}{EVENTS_PATH}")
    if response.status_code != 200:
        raise EngineError(f"POST {EVENTS_PATH} answered {response.status_code}")
    events = msgspec.json.decode(response.content)
    if not isinstance(events, list):
        raise EngineError(f"POST {EVENTS_PATH} did not answer a list")
    if not events:
        return []
    by_rank: dict[Any, list[Any]] = {}
    for event in events:
        rank = event.get("attention_dp_rank") if isinstance(event, dict) else None
        by_rank.setdefault(rank, []).append(event)
    return [msgspec.json.encode(group) for group in by_rank.values()]
