"""Run one workload against several targets back to back (URLs, or local stacks per policy)."""

from __future__ import annotations

import asyncio
import shlex
import tempfile
from pathlib import Path

from rich.console import Console

from infera_core.bench.config import BenchSettings
from infera_core.bench.plan import make_sessions, run_config
from infera_core.bench.runner import RunResult, api_root, run_bench
from infera_core.bench.variants import PolicyVariant, parse_variant
from infera_core.plugin.hooks import InferaHooks


def _label(url: str, all_urls: list[str]) -> str:
    root = api_root(url)
    short = root.split("://", 1)[-1]
    return short if all_urls.count(url) == 1 else f"{short} #{all_urls.index(url) + 1}"


async def run_targets(
    s: BenchSettings, console: Console, hooks: InferaHooks | None = None, stop: asyncio.Event | None = None
) -> list[RunResult]:
    """One :class:`RunResult` per target, in order (same sessions for each).

    Once ``stop`` is set the current run ends early (requests in flight finish) and no
    further target is started.
    """
    runs: list[RunResult] = []
    if s.policies:
        import logging

        for noisy in ("infera.launcher", "httpx"):
            logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
        hooks = hooks or InferaHooks.load()
        registry = hooks.catalog().policies
        with tempfile.TemporaryDirectory(prefix="infera-bench-") as tmp:
            entries = [p.strip() for p in s.policies.split(",") if p.strip()]
            variants = [parse_variant(entry, registry, Path(tmp)) for entry in entries]
            for variant in variants:
                if stop is not None and stop.is_set():
                    break
                runs.append(await _run_stack(s, console, hooks, variant, stop))
        return runs
    for url in s.url:
        if stop is not None and stop.is_set():
            break
        runs.append(await run_bench(make_sessions(s), run_config(s, url, _label(url, s.url), stop), console))
    return runs


async def _run_stack(
    s: BenchSettings, console: Console, hooks: InferaHooks, variant: PolicyVariant, stop: asyncio.Event | None
) -> RunResult:
    """Start a local stack routing with ``variant``, run the workload against it, stop it."""
    from infera_core.up.settings import UpSettings
    from infera_core.up.stack import Stack

    up = UpSettings(
        workers=s.workers,
        engine=s.engine,
        policy=variant.preset,
        router_config=variant.router_config,
        model=s.model or "sim-model",
        port=0,
        quiet=True,
    )
    async with Stack(up, hooks, engine_args=shlex.split(s.engine_args or "")) as stack:
        console.print(f"[dim]stack up: {stack.url} ({s.workers} {s.engine} workers, policy {variant.label})")
        return await run_bench(make_sessions(s), run_config(s, stack.url, variant.label, stop), console)
