"""``infera-run up --demo``: what KV-aware routing does on a shared-prefix workload.

The same workload runs twice on the same workers, each time from an empty prefix
cache (``POST /reset_prefix_cache`` on every worker): once through a second,
temporary router with the ``round-robin`` policy (what a cache-blind router gets),
once through the stack's own router.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp
from rich.console import Console
from rich.table import Table

from infera_core.bench.runner import BenchConfig, RunResult, run_bench
from infera_core.bench.scrape import fetch_workers
from infera_core.bench.workloads import shared_prefix_workload
from infera_core.errors import ConfigError
from infera_core.up.stack import Stack


@dataclass(frozen=True, slots=True)
class DemoWorkload:
    groups: int = 8
    questions_per_group: int = 6
    prefix_len: int = 768
    question_len: int = 24
    output_len: int = 16
    concurrency: int = 4


async def reset_caches(urls: list[str]) -> None:
    async with aiohttp.ClientSession() as session:

        async def one(url: str) -> None:
            try:
                async with session.post(f"{url}/reset_prefix_cache", timeout=aiohttp.ClientTimeout(total=5)):
                    pass
            except (aiohttp.ClientError, TimeoutError):
                pass

        await asyncio.gather(*(one(u) for u in urls))
    await asyncio.sleep(0.3)  # let the routers' KV views apply the clear events


async def run_demo(
    stack: Stack, console: Console, w: DemoWorkload | None = None, baseline: str = "round-robin"
) -> tuple[RunResult, RunResult]:
    """(the ``baseline`` policy, the stack's policy) on the same workload and the same workers."""
    w = w or DemoWorkload()
    # the admin token reads /v1/workers and /metrics and is accepted as an API key (no limits)
    token = stack.settings.admin_token.get_secret_value() if stack.settings.admin_token else None
    if stack.settings.api_key_file is not None and token is None:
        raise ConfigError("--demo with --api-key-file needs --admin-token (the demo sends it as its key)")
    async with aiohttp.ClientSession() as session:
        workers = await fetch_workers(
            session, stack.root, {"Authorization": f"Bearer {token}"} if token else None
        )
    urls = sorted(workers.values())
    sessions = shared_prefix_workload(
        w.groups, w.prefix_len, w.questions_per_group, w.question_len, w.output_len, seed=7
    )
    model = stack.settings.model
    async with stack.side_server(baseline) as side_url:
        await reset_caches(urls)
        cfg = BenchConfig(
            url=side_url,
            model=model,
            concurrency=w.concurrency,
            label=baseline,
            api_key=token,
            admin_token=token,
        )
        base = await run_bench(sessions, cfg, console)
    await reset_caches(urls)
    cfg = BenchConfig(
        url=stack.url,
        model=model,
        concurrency=w.concurrency,
        label=f"infera ({stack.policy})",
        api_key=token,
        admin_token=token,
    )
    routed = await run_bench(sessions, cfg, console)
    return base, routed


def print_demo(rr: RunResult, routed: RunResult, console: Console, w: DemoWorkload | None = None) -> None:
    w = w or DemoWorkload()

    def pct(r: RunResult) -> str:
        v = r.summary.get("prefix_cache_hit_rate")
        return "-" if v is None else f"{v:.1%}"

    def ms(r: RunResult, p: str) -> str:
        v = r.summary["ttft_s"].get(p)
        return "-" if v is None else f"{v * 1000:.0f} ms"

    t = Table(
        title=f"Demo: {w.groups} groups × {w.questions_per_group} questions, "
        f"{w.prefix_len}-word shared prefix, {len(rr.cache.per_worker)} workers"
    )
    t.add_column("")
    t.add_column(rr.label, justify="right")
    t.add_column(routed.label, justify="right")
    t.add_row("prefix-cache hit rate", pct(rr), pct(routed))
    t.add_row("TTFT p50", ms(rr, "p50"), ms(routed, "p50"))
    t.add_row("TTFT p90", ms(rr, "p90"), ms(routed, "p90"))
    t.add_row("errors", str(rr.summary["failed"]), str(routed.summary["failed"]))
    console.print(t)
