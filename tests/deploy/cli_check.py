"""Check a command line written in a deployment file against the real ``infera-run`` CLI.

:func:`check_command` parses the arguments exactly as ``infera-run`` would (group, subcommand,
engine subcommand; every option must exist and every value convert) without running anything,
and raises ``click.UsageError`` naming the bad flag.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import click

from infera_core.cli import build_cli
from infera_core.facade import InferaHooks


@functools.cache
def _cli() -> tuple[click.Group, InferaHooks]:
    hooks = InferaHooks.load(strict=True)
    return build_cli(hooks), hooks


def _unparsed(ctx: click.Context) -> list[str]:
    """The subcommand and its arguments, as a group's ``invoke`` reads them."""
    return [*getattr(ctx, "_protected_args", []), *ctx.args]


def check_command(args: Sequence[str]) -> list[str]:
    """Parse ``infera-run *args``; return the command path (e.g. ``["worker", "vllm"]``)."""
    cli, hooks = _cli()
    ctx = cli.make_context("infera-run", list(args), resilient_parsing=False)
    ctx.obj = hooks  # what the group's callback would set
    command: click.Command = cli
    path: list[str] = []
    rest = _unparsed(ctx)
    while isinstance(command, click.Group):
        if not rest:
            raise click.UsageError(f"infera-run {' '.join(path)}: a subcommand is missing")
        name, sub, rest = command.resolve_command(ctx, rest)
        assert name is not None and sub is not None
        path.append(name)
        ctx = sub.make_context(name, rest, parent=ctx, resilient_parsing=False)
        command = sub
        rest = _unparsed(ctx)
    return path
