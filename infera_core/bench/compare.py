"""Run one workload against several targets back to back (URLs, or local stacks per policy)."""

from __future__ import annotations

import asyncio
import shlex
from pathlib import Path

from rich.console import Console

from infera_core.bench.config import BenchSettings
from infera_core.bench.plan import make_sessions, run_config
from infera_core.bench.runner import RunResult, api_root, run_bench
from infera_core.errors import ConfigError
from infera_core.facade import InferaHooks

CONFIG_SUFFIXES = (".yaml", ".yml")


def policy_variant(entry: str) -> tuple[str, str | None, Path | None]:
    """One ``--policies`` entry → (label, preset, router config file).

    A preset name (``kv-aware``) is used as is; a path ending in ``.yaml``/``.yml`` is a
    router config (``--router-config``): a variant of a preset with other weights, e.g.
    ``kv-overlap`` with ``cpu: 0``. Its label is the file's stem.
    """
    if entry.endswith(CONFIG_SUFFIXES):
        path = Path(entry)
        if not path.is_file():
            raise ConfigError(f"--policies: router config {entry} not found")
        return path.stem, None, path
    return entry, entry, None


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

        from infera_core.up.settings import UpSettings
        from infera_core.up.stack import Stack

        for noisy in ("infera.launcher", "httpx"):
            logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
        variants = [policy_variant(p.strip()) for p in s.policies.split(",") if p.strip()]
        for policy, preset, config in variants:
            if stop is not None and stop.is_set():
                break
            up = UpSettings(
                workers=s.workers,
                engine=s.engine,
                policy=preset,
                router_config=config,
                model=s.model or "sim-model",
                port=0,
                quiet=True,
            )
            async with Stack(up, hooks, engine_args=shlex.split(s.engine_args or "")) as stack:
                console.print(f"[dim]stack up: {stack.url} ({s.workers} {s.engine} workers, policy {policy})")
                runs.append(
                    await run_bench(make_sessions(s), run_config(s, stack.url, policy, stop), console)
                )
        return runs
    for url in s.url:
        if stop is not None and stop.is_set():
            break
        runs.append(await run_bench(make_sessions(s), run_config(s, url, _label(url, s.url), stop), console))
    return runs
