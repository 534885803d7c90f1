"""``infera-run bench``: drive a workload against OpenAI-compatible URLs and report."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from infera_core.bench.config import BenchSettings
from infera_core.config.settings import click_options, resolve
from infera_core.errors import ConfigError, require_module
from infera_core.plugin.hooks import InferaHooks


@click.command("bench")
@click_options(BenchSettings)
@click.option(
    "--config", "config_file", type=click.Path(path_type=Path), help="YAML/JSON file with settings."
)
@click.pass_obj
def bench_cmd(hooks: InferaHooks, /, config_file: Path | None, **values: Any) -> None:
    """Benchmark an OpenAI-compatible endpoint (Infera, one engine, or another router).

    \b
    Examples:
      infera-run bench --url http://127.0.0.1:8000/v1 --workload shared-prefix --report out/
      infera-run bench --url http://127.0.0.1:8000/v1 --workload trace \\
          --trace mooncake.jsonl --time-scale 0.05 --max-requests 300
      infera-run bench --compare --policies round-robin,kv-aware --workload shared-prefix
    """
    settings = resolve(BenchSettings, values, config_file)
    require_module("aiohttp", "infera-run bench", "bench")  # its load generator's client
    try:
        asyncio.run(_main(settings, hooks))
    except (KeyboardInterrupt, asyncio.CancelledError):
        click.echo("infera-run bench: aborted", err=True)
        sys.exit(130)


async def _main(s: BenchSettings, hooks: InferaHooks) -> None:
    from infera_core.bench.plan import describe
    from infera_core.bench.report import print_table, write_json, write_report
    from infera_core.bench.runner import BenchError
    from infera_core.up.compare import run_targets

    if s.policies and s.url:
        raise ConfigError("--policies starts its own stacks; drop --url (or drop --policies)")
    if not s.policies and not s.url:
        raise ConfigError("--url is required (or --policies a,b to start a local stack per policy)")
    if s.compare and not s.policies and len(s.url) < 2:
        raise ConfigError("--compare needs several --url targets or --policies a,b")
    console = Console()
    err = Console(stderr=True)
    stop = asyncio.Event()
    main = asyncio.current_task()

    def on_sigint() -> None:
        if stop.is_set() and main is not None:
            main.cancel()  # second Ctrl-C: abort without a summary
            return
        stop.set()
        err.print("stopping: waiting for requests in flight, then the summary (Ctrl-C again to abort)")

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, on_sigint)
    try:
        runs = await run_targets(s, err, hooks, stop)
    finally:
        loop.remove_signal_handler(signal.SIGINT)
    if not runs:
        raise BenchError("stopped before any run finished")
    meta: dict[str, Any] = describe(s)
    caption = ", ".join(f"{k}={v}" for k, v in meta.items() if k != "seed")
    print_table(runs, console, caption=caption)
    if s.json_out:
        write_json(runs, s.json_out, meta)
        console.print(f"results: {s.json_out}")
    if s.report:
        md = write_report(runs, s.report, meta)
        console.print(f"report: {md}")
