"""``infera-run up``: the whole stack on this machine in one command."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from infera_core.cli.engine_help import UpCommand
from infera_core.config.settings import click_options, config_option, resolve
from infera_core.errors import InferaError, require_module
from infera_core.plugin.hooks import InferaHooks
from infera_core.plugin.settings import command_settings
from infera_core.up.settings import UpSettings


@click.command("up", cls=UpCommand, base=UpSettings, context_settings={"allow_interspersed_args": False})
@config_option
@click_options(UpSettings)
@click.argument("engine_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def up_cmd(
    ctx: click.Context, /, config_file: Path | None, engine_args: tuple[str, ...], **values: Any
) -> None:
    """Start discovery, the server and N workers here; Ctrl-C drains and stops everything.

    Engine flags go after `--`, e.g. `infera-run up --workers 4 -- --speedup 10 --cache-blocks 2048`.
    """
    hooks: InferaHooks = ctx.obj
    settings = resolve(command_settings(ctx, UpSettings), values, config_file)
    if settings.demo:
        require_module("aiohttp", "--demo", "aiohttp")  # the demo's load generator is the bench's
    try:
        import uvloop

        loop_factory: Any = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvicorn[standard] brings uvloop
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        code = runner.run(run_up(settings, hooks, list(engine_args)))
    sys.exit(code)


async def run_up(settings: UpSettings, hooks: InferaHooks, engine_args: list[str]) -> int:
    """Run the stack until SIGINT/SIGTERM (exit 0) or every worker is down for good (exit 1).

    A worker whose engine dies is restarted (``--restart-engine on-failure``) while the
    others keep serving; one that stays down is reported and the stack serves on without it."""
    from infera_core.up.stack import Stack
    from infera_core.up.status import LiveStatus

    err = Console(stderr=True)
    noisy = ["httpx", "uvicorn.error"] + ([] if settings.engine_logs else ["infera.launcher"])
    for noisy_logger in noisy:
        logging.getLogger(noisy_logger).setLevel(max(logging.WARNING, logging.getLogger().level))
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    stack = Stack(settings, hooks, engine_args=engine_args)
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        stop.set()
        if signals > 1:
            stack.skip_drain()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    try:
        err.print(f"[dim]starting {settings.fleet()} and the server (policy {stack.policy})…")
        starting = asyncio.ensure_future(stack.start())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():  # Ctrl-C while starting
            starting.cancel()
            with contextlib.suppress(BaseException):
                await starting
            await stack.stop(drain=False)
            err.print("stopped before the stack was ready")
            return 0
        stopping.cancel()
        starting.result()  # raises the start-up error (the stack is already stopped)
        print(
            f"Infera ready: {stack.url}  ({settings.fleet()}, policy {stack.policy})",
            flush=True,
        )
        print(f"Dashboard: {stack.root}/dashboard", flush=True)
        err.print(
            f"[dim]try: curl {stack.url}/chat/completions -H 'Content-Type: application/json' "
            f'-d \'{{"model": "{settings.model}", "messages": [{{"role": "user", "content": "hi"}}]}}\'',
            soft_wrap=True,
        )
        if settings.demo:
            await _demo(stack, err)
        return await _serve_until_stopped(stack, stop, settings, err, LiveStatus)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def _serve_until_stopped(
    stack: Any, stop: asyncio.Event, settings: UpSettings, err: Console, live_cls: Any
) -> int:
    status = None
    if not settings.quiet:
        token = settings.admin_token.get_secret_value() if settings.admin_token else None
        status = live_cls(
            stack.root,
            stack.policy,
            settings.status_interval,
            err,
            states=stack.worker_states,
            admin_token=token,
        )
        status.start()

    def report(line: str) -> None:
        err.print(f"[yellow]infera-run: {line}", soft_wrap=True)

    died = asyncio.ensure_future(stack.until_all_workers_stopped(report))
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({died, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if status is not None:
            await status.stop()
    code = 0
    if died.done() and not stopping.done():
        exc = died.result()
        err.print(
            f"infera-run: error: {exc}" if isinstance(exc, InferaError) else f"infera-run: error: {exc!r}"
        )
        code = 1
    died.cancel()
    stopping.cancel()
    err.print(f"stopping: draining {len(stack.launchers)} worker(s)… (Ctrl-C again to skip the wait)")
    await stack.stop()
    err.print("stopped")
    return code


async def _demo(stack: Any, err: Console) -> None:
    from infera_core.up.demo import print_demo, run_demo

    err.print("[bold]demo:[/] the same shared-prefix workload through a round-robin router, then this one…")
    rr, routed = await run_demo(stack, err)
    print_demo(rr, routed, Console())
