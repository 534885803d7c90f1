"""``infera-run plan``: how many workers a trace needs to meet an SLO, found in virtual time."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from infera_core.bench.capacity import (
    FleetResult,
    answer,
    parse_pd_ratios,
    parse_plan_slo,
    parse_workers,
    plan_fleets,
    series,
)
from infera_core.bench.plan_config import PlanSettings
from infera_core.bench.trace import trace_workload
from infera_core.bench.virtual import Arrival
from infera_core.config.settings import click_options, resolve
from infera_core.engines.timing import VirtualEngines, load_profile
from infera_core.errors import ConfigError
from infera_core.plugin.hooks import InferaHooks


@click.command("plan")
@click_options(PlanSettings)
@click.option(
    "--config", "config_file", type=click.Path(path_type=Path), help="YAML/JSON file with settings."
)
@click.pass_obj
def plan_cmd(hooks: InferaHooks, /, config_file: Path | None, **values: Any) -> None:
    """Find the smallest fleet that meets an SLO on a trace, by replaying it in virtual time.

    \b
    Examples:
      infera-run plan --trace mooncake.jsonl --profile vllm-h100.json \\
          --slo ttft_p90=2s,tpot_p90=50ms --workers 1..16 --plot plan.png
      infera-run plan --trace t.jsonl --profile p.json --slo ttft_p90=1s \\
          --policy kv-aware,round-robin --pd-ratio mixed,1:3 --json
    Check the answer live with the same trace flags:
      infera-run up --workers N -- --profile p.json &
      infera-run bench --url http://127.0.0.1:8000/v1 --workload trace --trace t.jsonl …
    """
    s = resolve(PlanSettings, values, config_file)
    if s.trace is None:
        raise ConfigError("--trace is required (a Mooncake JSONL trace)")
    if s.profile is None:
        raise ConfigError("--profile is required (a timing profile from infera-run calibrate)")
    if not s.slo:
        raise ConfigError("--slo is required, e.g. --slo ttft_p90=2s,tpot_p90=50ms")
    targets = parse_plan_slo(s.slo)
    sizes = parse_workers(s.workers)
    ratios = parse_pd_ratios(s.pd_ratio)
    timing = load_profile(s.profile)
    adapter = hooks.require("engine", s.engine)
    if not isinstance(adapter, VirtualEngines):
        raise ConfigError(f"--engine {s.engine}: its adapter cannot run on a virtual clock (use sim)")
    registry = hooks.catalog().policies
    policies = [(name, registry.preset(name).profile) for name in _names(s.policy)]
    sessions = trace_workload(
        s.trace,
        s.max_requests,
        s.time_scale,
        s.seed,
        s.vocab_size,
        max_output_len=s.max_output_len,
        block_tokens=s.tokens_per_block,
    )
    arrivals = [Arrival(x.at or 0.0, _ids(x.turns[0].prompt), x.turns[0].max_tokens) for x in sessions]
    cache_blocks = s.cache_blocks if s.cache_blocks is not None else (timing.cache_blocks or 4096)
    results = plan_fleets(arrivals, targets, sizes, policies, ratios, adapter, timing, registry, cache_blocks)
    best = answer(results)
    plot = None
    if s.plot is not None:
        from infera_core.bench.plots import attainment_vs_workers

        attainment_vs_workers(series(results), best.workers if best else None, s.slo, s.plot)
        plot = str(s.plot)
    if s.json_output:
        out: dict[str, Any] = {
            "workers": best.workers if best else None,
            "meets_slo": best is not None,
            "slo": {t.key: t.seconds for t in targets},
            "answer": best.to_json() if best else None,
            "fleets": [r.to_json() for r in results],
            "requests": len(arrivals),
            "plot": plot,
        }
        click.echo(json.dumps(out, indent=2))
    else:
        _print(results, best, s.slo, [t.key for t in targets], len(arrivals), plot)
    if best is None:
        sys.exit(2)


def _ids(prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, str):  # trace prompts are token ids; a text prompt cannot come from a trace
        raise ConfigError("--trace: expected token-id prompts")
    return prompt


def _names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ConfigError("--router-policy: name at least one routing preset (e.g. kv-aware)")
    return names


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v * 1000:.0f}ms" if v < 1 else f"{v:.2f}s"


def _print(
    results: list[FleetResult],
    best: FleetResult | None,
    slo: str,
    targets: list[str],
    n: int,
    plot: str | None,
) -> None:
    console = Console()
    keys = list(dict.fromkeys(["ttft_p50", *targets]))
    table = Table(title=f"{n} requests replayed in virtual time; SLO {slo}")
    for col in ("policy", "fleet", *keys, "hit", "attainment", "SLO"):
        table.add_column(col, justify="left" if col in ("policy", "fleet") else "right")
    for r in results:
        mark = "met" if r.meets else "missed"
        row = [_fmt(r.observed[k]) for k in keys]
        table.add_row(r.policy, r.shape, *row, f"{r.hit:.2f}", f"{r.attainment:.0%}", mark)
    console.print(table)
    if best is None:
        console.print("no fleet tried meets the SLO: try more --workers (e.g. 1..64) or a looser --slo")
    else:
        margin = f"{best.margin:.0%}" if best.margin is not None else "-"
        console.print(
            f"plan: {best.workers} workers ({best.policy}, {best.shape}) meet {slo} "
            f"with {margin} margin; attainment {best.attainment:.0%}"
        )
    if plot:
        console.print(f"plot: {plot}")
