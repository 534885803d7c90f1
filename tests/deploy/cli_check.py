"""Check a command line written in a deployment file against the real ``infera-run`` CLI.

:func:`check_command` parses the arguments exactly as ``infera-run`` would (group, subcommand,
engine subcommand; every option must exist and every value convert) without running anything,
and raises ``click.UsageError`` naming the bad flag.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

import click

from infera_core.cli import build_cli
from infera_core.cli.lazy_group import LazyCommand
from infera_core.plugin.hooks import InferaHooks


@functools.cache
def _cli() -> tuple[click.Group, InferaHooks]:
    hooks = InferaHooks.load(strict=True)
    return build_cli(hooks), hooks


def _unparsed(ctx: click.Context) -> list[str]:
    """The subcommand and its arguments, as a group's ``invoke`` reads them."""
    return [*getattr(ctx, "_protected_args", []), *ctx.args]


ENTRYPOINT_ENV = {"INFERA_RUN", "INFERA_VENV", "INFERA_ENGINE_PYTHON_LINK", "INFERA_HEALTHCHECK_TIMEOUT"}
"""Variables the image scripts (entrypoint.sh, install-infera.sh, healthcheck.py) read themselves."""


def _env_of(command: click.Command, ctx: click.Context) -> set[str]:
    """The variables a command's ``--help`` names (``[env: INFERA_X]``), plugin backends' included."""
    params = command.get_params(click.Context(command, parent=ctx))
    return {m for p in params for m in re.findall(r"\[env: (INFERA_\w+)\]", getattr(p, "help", "") or "")}


def known_env(args: Sequence[str]) -> set[str]:
    """Every ``INFERA_*`` variable ``infera-run *args`` reads (its options' and its groups')."""
    path = check_command(args)
    cli, _ = _cli()
    ctx = click.Context(cli, obj=_cli()[1])
    names = _env_of(cli, ctx)
    command: click.Command = cli
    for name in path:
        assert isinstance(command, click.Group)
        found = command.get_command(ctx, name)
        assert found is not None
        command = found.load() if isinstance(found, LazyCommand) else found  # lazy: no params until loaded
        names |= _env_of(command, ctx)
    return names | ENTRYPOINT_ENV


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
