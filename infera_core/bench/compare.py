"""Run one workload against several targets back to back (URLs, or local stacks per policy)."""

from __future__ import annotations

from rich.console import Console

from infera_core.bench.config import BenchSettings
from infera_core.bench.plan import make_sessions, run_config
from infera_core.bench.runner import RunResult, api_root, run_bench
from infera_core.errors import ConfigError


def _label(url: str, all_urls: list[str]) -> str:
    root = api_root(url)
    short = root.split("://", 1)[-1]
    return short if all_urls.count(url) == 1 else f"{short} #{all_urls.index(url) + 1}"


async def run_targets(s: BenchSettings, console: Console) -> list[RunResult]:
    """One :class:`RunResult` per target, in order (same sessions for each)."""
    runs: list[RunResult] = []
    if s.policies:
        raise ConfigError("--policies needs the local stack (infera-run up), which is not available yet")
    for url in s.url:
        runs.append(await run_bench(make_sessions(s), run_config(s, url, _label(url, s.url)), console))
    return runs
