"""Turn :class:`BenchSettings` into sessions and run configs (shared by bench, up --demo, fleet scale)."""

from __future__ import annotations

import asyncio

from infera_core.bench.config import BenchSettings
from infera_core.bench.runner import BenchConfig
from infera_core.bench.stats import parse_slo
from infera_core.bench.trace import trace_workload
from infera_core.bench.workloads import (
    Api,
    Session,
    multi_turn_workload,
    poisson_arrivals,
    random_workload,
    shared_prefix_workload,
)
from infera_core.errors import ConfigError


def _api(s: BenchSettings, default: Api) -> Api:
    return default if s.api == "auto" else s.api


def make_sessions(s: BenchSettings) -> list[Session]:
    """The workload the settings describe (deterministic for a seed)."""
    sessions: list[Session]
    if s.workload == "random":
        sessions = random_workload(
            s.num_requests, s.input_len, s.output_len, s.range_ratio, s.seed, _api(s, "completions")
        )
    elif s.workload == "shared-prefix":
        sessions = shared_prefix_workload(
            s.groups,
            s.prefix_len,
            s.questions_per_group,
            s.question_len,
            s.output_len,
            s.seed,
            _api(s, "completions"),
        )
    elif s.workload == "multi-turn":
        sessions = multi_turn_workload(
            s.sessions,
            s.turns,
            s.input_len,
            s.turn_len,
            s.output_len,
            s.think_time,
            s.seed,
            _api(s, "chat"),
            s.system_len,
        )
    else:
        if s.trace is None:
            raise ConfigError("--workload trace needs --trace FILE (Mooncake JSONL)")
        if s.api == "chat":
            raise ConfigError(
                "--workload trace sends token ids to /v1/completions; --api chat does not apply"
            )
        return trace_workload(
            s.trace,
            s.max_requests,
            s.time_scale,
            s.seed,
            s.vocab_size,
            use_timestamps=not s.ignore_timestamps and s.rate is None,
            max_output_len=s.max_output_len,
            block_tokens=s.tokens_per_block,
        )
    if s.rate is not None:
        poisson_arrivals(sessions, s.rate, s.seed)
    return sessions


def run_config(s: BenchSettings, url: str, label: str = "", stop: asyncio.Event | None = None) -> BenchConfig:
    open_loop = s.rate is not None or (s.workload == "trace" and not s.ignore_timestamps)
    return BenchConfig(
        url=url,
        model=s.model,
        concurrency=s.concurrency if (s.concurrency or open_loop) else 8,
        timeout=s.timeout,
        ignore_eos=s.ignore_eos,
        slo=parse_slo(s.slo),
        metrics_urls=list(s.metrics_url),
        label=label or url,
        progress=not s.quiet,
        stop=stop,
        api_key=s.api_key.get_secret_value() if s.api_key else None,
        admin_token=s.admin_token.get_secret_value() if s.admin_token else None,
    )


def describe(s: BenchSettings) -> dict[str, object]:
    """Workload parameters for the report header."""
    common: dict[str, object] = {"workload": s.workload, "seed": s.seed}
    if s.workload == "random":
        common |= {"requests": s.num_requests, "input_len": s.input_len, "output_len": s.output_len}
    elif s.workload == "shared-prefix":
        common |= {
            "groups": s.groups,
            "prefix_len": s.prefix_len,
            "questions_per_group": s.questions_per_group,
            "question_len": s.question_len,
            "output_len": s.output_len,
        }
    elif s.workload == "multi-turn":
        common |= {"sessions": s.sessions, "turns": s.turns, "think_time": s.think_time}
    else:
        common |= {"trace": str(s.trace), "time_scale": s.time_scale, "max_requests": s.max_requests}
    if s.rate is not None:
        common["arrival"] = f"poisson {s.rate}/s"
    elif s.workload == "trace" and not s.ignore_timestamps:
        common["arrival"] = "trace timestamps"
    else:
        common["arrival"] = f"closed loop, concurrency {s.concurrency or 8}"
    if s.slo:
        common["slo"] = s.slo
    return common
